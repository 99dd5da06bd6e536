#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string>

#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/cpu/fma_peak.h"
#include "core/profiler.h"
#include "core/ops/matmul.h"
#include "core/ops/optim.h"
#include "distributed/communicator.h"
#include "distributed/flat_shard.h"
#include "distributed/sharded_block_hooks.h"
#include "distributed/sharded_checkpoint.h"
#include "models/accounting.h"
#include "models/ham.h"
#include "nn/elementwise.h"
#include "nn/optim.h"
#include "train/gradient_monitor.h"
#include "train/metrics_log.h"
#include "train/stop_signals.h"
#include "train/synthetic.h"

namespace ham {

Device resolve_training_device(const std::string& spec, int local_rank) {
  Device device = Device::parse(spec);
  if (spec == "cuda") device = Device::cuda(local_rank);
  if (device.is_cpu()) return device;
  try {
    Tensor::zeros({1}, DType::F32, device);
  } catch (const std::exception& e) {
    HAM_FAIL("train option 'device' (", spec, "): cannot use ", device.str(), ": ", e.what());
  }
  return device;
}

DType training_dtype(const std::string& precision) {
  if (precision == "f32") return DType::F32;
  if (precision == "bf16") return DType::BF16;
  HAM_FAIL("train option 'precision': unknown precision '", precision, "' (expected f32 or bf16)");
}

TokenBatch batch_on_device(const TokenBatch& batch, Device device) {
  auto moved = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  return {moved(batch.inputs), moved(batch.targets), moved(batch.doc_ids),
          moved(batch.positions)};
}

Device model_device(const LanguageModel& model) {
  std::vector<Tensor> params = model.parameters();
  return params.empty() ? Device::cpu() : params.front().device();
}

double evaluate(const LanguageModel& model, const TokenSource& data, int64_t batch,
                int64_t seq_len, int64_t max_batches) {
  NoGradGuard no_grad;
  std::vector<TokenBatch> batches = data.sequential(batch, seq_len, max_batches);
  HAM_CHECK(!batches.empty(), "evaluate: the validation stream (", data.size(),
            " tokens) is shorter than one window of ", seq_len + 1);
  const Device device = model_device(model);
  double total = 0;
  for (const TokenBatch& b : batches) total += model.loss(batch_on_device(b, device)).item();
  return total / double(batches.size());
}

nlohmann::json TrainOptions::to_json() const {
  return {{"steps", steps}, {"batch_size", batch_size}, {"seq_len", seq_len},
          {"grad_accum", grad_accum}, {"lr", lr}, {"min_lr_ratio", min_lr_ratio},
          {"warmup_steps", warmup_steps}, {"weight_decay", weight_decay}, {"beta1", beta1},
          {"beta2", beta2}, {"eps", eps}, {"clip", clip}, {"log_every", log_every},
          {"eval_every", eval_every}, {"eval_batches", eval_batches}, {"seed", seed},
          {"skip_nonfinite", skip_nonfinite}, {"data_path", data_path}, {"val_data_path", val_data_path}, {"tokenizer", tokenizer},
          {"out_dir", out_dir}, {"log_dir", log_dir},
          {"checkpoint_every", checkpoint_every}, {"keep_checkpoints", keep_checkpoints},
          {"mix_mqar", mix_mqar}, {"mqar_pairs", mqar_pairs}, {"mix_niah", mix_niah},
          {"peak_gflops", peak_gflops}, {"grad_norms_every", grad_norms_every},
          {"dump_grads", dump_grads}, {"dump_grads_at", dump_grads_at},
          {"shard", shard}, {"shard_group_size", shard_group_size}, {"device", device},
          {"precision", precision}, {"profile_steps", profile_steps},
          {"profile_trace", profile_trace}};
}

void TrainOptions::update_from_json(const nlohmann::json& j, const std::string& source) {
  HAM_CHECK(j.is_object(), source, ": train options must be a JSON object");
  nlohmann::json merged = to_json();
  for (const auto& item : j.items()) {
    HAM_CHECK(merged.contains(item.key()), source, ": unknown train option '", item.key(), "'");
    HAM_CHECK(std::string(item.value().type_name()) == merged[item.key()].type_name() ||
                  (item.value().is_number() && merged[item.key()].is_number()),
              source, ": train option '", item.key(), "' must be a ",
              merged[item.key()].type_name(), ", got ", item.value().dump());
    merged[item.key()] = item.value();
  }
  TrainOptions o;
  auto get = [&](const char* key, auto& field) {
    try {
      field = merged.at(key).get<std::decay_t<decltype(field)>>();
    } catch (const nlohmann::json::type_error&) {  // a list holding the wrong element type
      HAM_FAIL(source, ": train option '", key, "' has the wrong element type: ",
               merged.at(key).dump());
    }
  };
  get("steps", o.steps); get("batch_size", o.batch_size); get("seq_len", o.seq_len);
  get("grad_accum", o.grad_accum); get("lr", o.lr); get("min_lr_ratio", o.min_lr_ratio);
  get("warmup_steps", o.warmup_steps); get("weight_decay", o.weight_decay);
  get("beta1", o.beta1); get("beta2", o.beta2); get("eps", o.eps); get("clip", o.clip);
  get("log_every", o.log_every); get("eval_every", o.eval_every);
  get("eval_batches", o.eval_batches); get("seed", o.seed);
  get("skip_nonfinite", o.skip_nonfinite); get("data_path", o.data_path); get("val_data_path", o.val_data_path);
  get("tokenizer", o.tokenizer); get("out_dir", o.out_dir); get("log_dir", o.log_dir);
  get("checkpoint_every", o.checkpoint_every); get("keep_checkpoints", o.keep_checkpoints);
  get("mix_mqar", o.mix_mqar); get("mqar_pairs", o.mqar_pairs); get("mix_niah", o.mix_niah);
  get("peak_gflops", o.peak_gflops); get("grad_norms_every", o.grad_norms_every);
  get("dump_grads", o.dump_grads); get("dump_grads_at", o.dump_grads_at);
  get("shard", o.shard); get("shard_group_size", o.shard_group_size);
  get("device", o.device);
  get("precision", o.precision);
  get("profile_steps", o.profile_steps); get("profile_trace", o.profile_trace);
  dist::parse_sharding_stage(o.shard);  // fails here, naming the stages, when misspelt
  try {
    Device::parse(o.device);
  } catch (const Error& e) {
    HAM_FAIL(source, ": train option 'device': ", e.what());
  }
  try {
    training_dtype(o.precision);
  } catch (const Error& e) {
    HAM_FAIL(source, ": ", e.what());
  }
  o.validate(source);
  *this = o;
}

void TrainOptions::validate(const std::string& source) const {
  // name: the JSON key and, where `ham train` has one, its flag.
  const std::string from = source.empty() ? "" : source + ": ";
  auto check = [&](bool ok, const char* name, const auto& value, const char* range) {
    HAM_CHECK(ok, from, "train option ", name, " must be ", range, ", got ", value);
  };
  auto finite = [](double x) { return std::isfinite(x); };
  check(steps > 0, "'steps' (--steps)", steps, "> 0");
  check(batch_size > 0, "'batch_size' (--batch-size)", batch_size, "> 0");
  check(seq_len > 0, "'seq_len' (--seq-len)", seq_len, "> 0");
  check(grad_accum > 0, "'grad_accum' (--grad-accum)", grad_accum, "> 0");
  check(finite(lr) && lr > 0, "'lr' (--lr)", lr, "finite and > 0");
  check(min_lr_ratio >= 0 && min_lr_ratio <= 1, "'min_lr_ratio'", min_lr_ratio, "in [0, 1]");
  check(warmup_steps >= 0, "'warmup_steps' (--warmup)", warmup_steps, ">= 0");
  check(finite(weight_decay) && weight_decay >= 0, "'weight_decay' (--weight-decay)",
        weight_decay, "finite and >= 0");
  check(beta1 >= 0 && beta1 < 1, "'beta1'", beta1, "in [0, 1)");
  check(beta2 >= 0 && beta2 < 1, "'beta2'", beta2, "in [0, 1)");
  check(finite(eps) && eps > 0, "'eps'", eps, "finite and > 0");
  check(finite(clip) && clip >= 0, "'clip' (--clip)", clip, "finite and >= 0 (0: no clipping)");
  check(log_every > 0, "'log_every' (--log-every)", log_every, "> 0");
  check(eval_every >= 0, "'eval_every' (--eval-every)", eval_every, ">= 0 (0: only at the end)");
  check(eval_batches > 0, "'eval_batches'", eval_batches, "> 0");
  check(checkpoint_every >= 0, "'checkpoint_every' (--checkpoint-every)", checkpoint_every,
        ">= 0 (0: only at the end)");
  check(keep_checkpoints >= 0, "'keep_checkpoints' (--keep)", keep_checkpoints, ">= 0 (0: all)");
  check(mix_mqar >= 0 && mix_mqar <= 1, "'mix_mqar' (--mix-mqar)", mix_mqar, "in [0, 1]");
  check(mix_niah >= 0 && mix_niah <= 1, "'mix_niah' (--mix-niah)", mix_niah, "in [0, 1]");
  check(mix_mqar + mix_niah <= 1, "'mix_mqar' + 'mix_niah'", mix_mqar + mix_niah, "<= 1");
  check(mqar_pairs > 0, "'mqar_pairs' (--mqar-pairs)", mqar_pairs, "> 0");
  check(finite(peak_gflops) && peak_gflops >= 0, "'peak_gflops' (--peak-gflops)", peak_gflops,
        "finite and >= 0 (0: measure this CPU)");
  check(grad_norms_every >= 0, "'grad_norms_every' (--grad-norms-every)", grad_norms_every,
        ">= 0 (0: never)");
  check(shard_group_size >= 0, "'shard_group_size' (--shard-group-size)", shard_group_size,
        ">= 0 (0: all ranks)");
  check(profile_steps >= 0, "'profile_steps' (--profile)", profile_steps, ">= 0 (0: none)");
  HAM_CHECK(profile_trace.empty() || profile_steps > 0, from,
            "train option 'profile_trace' (--profile-trace) needs 'profile_steps' (--profile) > 0");
}

void TrainOptions::update_from_file(const std::string& path) {
  std::ifstream in(path);
  HAM_CHECK(in, path, ": cannot open train config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    HAM_FAIL(path, ": invalid JSON: ", e.what());
  }
  update_from_json(j, path);
}

namespace {

std::vector<std::pair<std::string, Tensor>> with_prefix(
    const std::string& prefix, const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : named) out.emplace_back(prefix + name, t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> strip_prefix(
    const std::string& prefix, const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : named) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  }
  return out;
}

// The training rows: windows of the data, or, with mix_* set, a per-row mixture of the
// data with synthetic recall tasks. Every draw uses the trainer's data generator, so the
// checkpointed generator state reproduces the mixture on resume too.
std::function<TokenBatch(int64_t, int64_t, Generator&)> make_row_sampler(
    const TokenSource& data, const TrainOptions& opt, const ModelConfig& config) {
  auto from_data = [&data](int64_t rows, int64_t seq_len, Generator& gen) {
    return data.sample(rows, seq_len, gen);
  };
  if (opt.mix_mqar <= 0 && opt.mix_niah <= 0) return from_data;  // ranges: validate()
  // With mix_mqar + mix_niah = 1 every row is synthetic and the data is never read.
  std::vector<MixtureSource> sources;
  double data_weight = 1 - opt.mix_mqar - opt.mix_niah;
  if (data_weight > 0) sources.push_back({"data", data_weight, from_data});
  if (opt.mix_mqar > 0) {
    MqarConfig mqar;
    mqar.vocab_size = config.vocab_size;
    mqar.num_pairs = opt.mqar_pairs;
    mqar.seq_len = opt.seq_len;
    mqar.validate();
    sources.push_back(mqar_source(mqar, opt.mix_mqar));
  }
  if (opt.mix_niah > 0) {
    HAM_CHECK(data.document_start_id() == ByteTokenizer::kEndOfText, "train options: mix_niah "
              "needs byte-level data (NIAH rows are text encoded with the byte tokenizer)");
    ByteTokenizer bytes;
    sources.push_back(niah_source(NiahConfig::preset(NiahKind::Single1, opt.seq_len),
                                  [bytes](std::string_view text) { return bytes.encode(text); },
                                  ByteTokenizer::kEndOfText, opt.mix_niah));
  }
  auto mixture = std::make_shared<BatchMixture>(std::move(sources), 0);
  // One throwaway draw per source, so an impossible setting (e.g. a sequence too short for
  // a needle-in-a-haystack prompt) fails before training starts.
  for (const MixtureSource& source : mixture->sources()) {
    Generator probe(0);
    source.sample(1, opt.seq_len, probe);
  }
  return [mixture](int64_t rows, int64_t seq_len, Generator& gen) {
    return mixture->sample(rows, seq_len, gen);
  };
}

// What one look at every gradient's squared norm finds: the name of the first parameter
// whose gradient holds a NaN or Inf ("" if none), and the global norm that the clipping
// takes (their sum in the parameters' order, as gradient_norm sums it). One
// ops::squared_norms call (a NaN or Inf element makes a square non-finite; finite bf16 or
// f32 squares cannot overflow its f64 sum): on a GPU one wait for the check and the
// clipping together, where one a tensor had taken 8.6% of the paper's HAM's step on the H200.
struct GradientCheck {
  std::string first_nonfinite;
  double norm = 0;
};

GradientCheck check_gradients(const LanguageModel& model) {
  std::vector<std::string> names;
  std::vector<Tensor> grads;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = grad(p);
    if (!g.defined()) continue;
    names.push_back(name);
    grads.push_back(g);
  }
  const std::vector<double> squares = ops::squared_norms(grads);
  GradientCheck checked;
  double total = 0;
  for (size_t i = 0; i < squares.size(); ++i) {
    if (!std::isfinite(squares[i]) && checked.first_nonfinite.empty()) {
      checked.first_nonfinite = names[i];
    }
    total += squares[i];
  }
  checked.norm = std::sqrt(total);
  return checked;
}

}  // namespace

namespace {

// Rows [begin, end) of every tensor of a batch.
TokenBatch rows_of(const TokenBatch& batch, int64_t begin, int64_t end) {
  auto rows = [&](const Tensor& t) { return t.defined() ? t.slice(begin, end) : Tensor(); };
  return {rows(batch.inputs), rows(batch.targets), rows(batch.doc_ids), rows(batch.positions)};
}

// Targets that count in the loss (cross_entropy's ignore_index is -100).
int64_t counted_targets(const Tensor& targets) {
  int64_t count = 0;
  for (int64_t t : targets.clone().to_vector<int64_t>()) count += t != -100;
  return count;
}

// Mean validation loss when every rank evaluates its rows of each window batch: the
// rank-average of the per-rank means is the one-process mean (each rank has the same
// number of rows and every window target counts). "full" sharding gathers block by block
// through the model's hooks.
double evaluate_distributed(const LanguageModel& model, const TokenSource& data,
                            const TrainOptions& opt, dist::Communicator& world) {
  NoGradGuard no_grad;
  std::vector<TokenBatch> batches = data.sequential(opt.batch_size, opt.seq_len, opt.eval_batches);
  HAM_CHECK(!batches.empty(), "evaluate: the validation stream (", data.size(),
            " tokens) is shorter than one window of ", opt.seq_len + 1);
  const int64_t rows = opt.batch_size / world.size(), first = world.rank() * rows;
  const Device device = model_device(model);
  double total = 0;
  for (const TokenBatch& b : batches) {
    total += model.loss(batch_on_device(rows_of(b, first, first + rows), device)).item();
  }
  return world.all_reduce_scalar(total / double(batches.size()), dist::ReduceOp::Avg);
}

// A stream that discards what it is given (the log of ranks other than 0).
class NullBuffer final : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// JSON holds no NaN: nlohmann writes it as null, read back here as NaN.
double number_or_nan(const nlohmann::json& j) {
  return j.is_null() ? std::nan("") : j.get<double>();
}

// state.json's "history": the run's record up to the checkpoint, so that a resumed run's
// TrainResult covers it from step 1.
nlohmann::json history_to_json(const TrainResult& r) {
  return {{"recorded_from_step", r.recorded_from_step},
          {"first_loss", r.first_loss},
          {"initial_val_loss", r.initial_val_loss},
          {"final_val_loss", r.final_val_loss},
          {"skipped_steps", r.skipped_steps},
          {"step_losses", r.step_losses},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"train_seconds", r.train_seconds}};
}

}  // namespace

TrainResult train_result_at_checkpoint(const nlohmann::json& state, const std::string& source) {
  TrainResult r;
  try {
    r.steps = state.at("step").get<int64_t>();
    r.final_loss = number_or_nan(state.at("train_loss"));
    r.recorded_from_step = r.steps;
    if (!state.contains("history")) return r;
    const nlohmann::json& h = state.at("history");
    r.recorded_from_step = h.at("recorded_from_step").get<int64_t>();
    r.first_loss = number_or_nan(h.at("first_loss"));
    r.initial_val_loss = number_or_nan(h.at("initial_val_loss"));
    r.final_val_loss = number_or_nan(h.at("final_val_loss"));
    r.skipped_steps = h.at("skipped_steps").get<int64_t>();
    for (const nlohmann::json& loss : h.at("step_losses")) {
      r.step_losses.push_back(number_or_nan(loss));
    }
    r.peak_memory_bytes = h.at("peak_memory_bytes").get<int64_t>();
    r.train_seconds = h.at("train_seconds").get<double>();
  } catch (const nlohmann::json::exception& e) {
    HAM_FAIL(source, ": not a checkpoint's state (", e.what(), ")");
  }
  HAM_CHECK(r.recorded_from_step + int64_t(r.step_losses.size()) + r.skipped_steps == r.steps,
            source, ": history.step_losses holds ", r.step_losses.size(), " losses and ",
            r.skipped_steps, " skipped steps after step ", r.recorded_from_step,
            ", not the checkpoint's ", r.steps, " steps");
  r.last_checkpoint = state.value("checkpoint_dir", std::string());
  return r;
}

TrainResult train(LanguageModel& model, const TokenSource& train_data,
                  const TokenSource& val_data, const TrainOptions& opt, std::ostream& log_to,
                  std::optional<CheckpointContents> resume,
                  const std::shared_ptr<dist::Communicator>& world_or_null) {
  opt.validate("");
  std::shared_ptr<dist::Communicator> world =
      world_or_null ? world_or_null : std::make_shared<dist::SingleProcessCommunicator>();
  const int rank = world->rank(), world_size = world->size();
  // A world of one trains exactly as without distribution (nn's AdamW on the whole model);
  // more ranks shard the optimizer state and gradients (and parameters under "full").
  const bool sharded_run = world_size > 1;
  const dist::ShardingStage stage = dist::parse_sharding_stage(opt.shard);
  HAM_CHECK(opt.batch_size % world_size == 0, "train: --batch-size ", opt.batch_size,
            " (the global batch) must be a multiple of the ", world_size, " ranks");
  const int64_t local_rows = opt.batch_size / world_size, first_row = rank * local_rows;
  NullBuffer discard;
  std::ostream silent(&discard);
  std::ostream& log = rank == 0 ? log_to : silent;

  // Parameters move first: the optimizer state, the shards and the gradient monitor are
  // made from them on their device. A resumed checkpoint is copied into them there.
  const Device device = resolve_training_device(opt.device, world->local_rank());
  const DType compute_dtype = training_dtype(opt.precision);
  model.to(device);
  // Mixed precision: the model computes in bf16; the optimizers keep f32 master weights
  // (nn's AdamW and the sharded one both make them for bf16 parameters).
  const bool mixed_precision = compute_dtype == DType::BF16;
  if (mixed_precision) model.to(DType::BF16);

  Generator data_gen(opt.seed);
  CosineSchedule schedule{opt.lr, opt.lr * opt.min_lr_ratio, opt.warmup_steps, opt.steps};
  auto sample_rows = make_row_sampler(train_data, opt, model.config());
  bool has_val = val_data.size() > opt.seq_len + 1;
  // Built first, so that a dump pattern matching nothing fails before any work. Only rank
  // 0 logs and dumps; with several ranks it sees the full mean gradient, gathered from the
  // shards at the steps it reports on (dL/de_t: rank 0's rows only).
  GradientMonitorOptions monitor_options{opt.grad_norms_every, opt.dump_grads, opt.dump_grads_at,
                                         opt.out_dir.empty() ? opt.log_dir : opt.out_dir,
                                         opt.steps};
  GradientMonitor gradient_monitor(
      model, rank == 0 ? monitor_options : GradientMonitorOptions{0, {}, {}, "", opt.steps});
  auto monitor_reads_gradients = [&](int64_t step) {
    bool norms = opt.grad_norms_every > 0 && step % opt.grad_norms_every == 0;
    bool dump = !opt.dump_grads.empty() &&
                std::find(opt.dump_grads_at.begin(), opt.dump_grads_at.end(), step) !=
                    opt.dump_grads_at.end();
    return norms || dump;
  };

  TrainResult result;
  int64_t start_step = 0;
  if (resume) {
    start_step = resume->state.at("step").get<int64_t>();
    HAM_CHECK(start_step < opt.steps, "train: the checkpoint is at step ", start_step,
              ", nothing left to do for --steps ", opt.steps);
    // The record goes on from the checkpoint's; last_checkpoint names only what this call
    // writes.
    result = train_result_at_checkpoint(
        resume->state, resume->state.value("checkpoint_dir", std::string("checkpoint")) +
                           "/state.json");
    result.last_checkpoint.clear();
    // Before sharding: every rank starts from the same full parameters.
    model.load_parameters(resume->model);
  }

  // Exactly one of these optimizes: nn's AdamW (one process) or the sharded one.
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<dist::ShardedModel> sharded;
  std::unique_ptr<dist::ShardedAdamW> sharded_optimizer;
  // "full" gathers each block just before it runs, through the model's block hooks; they
  // point into `sharded`, so they come off the model however train() ends.
  struct RemoveBlockHooks {
    explicit RemoveBlockHooks(LanguageModel& hooked) : model(hooked) {}
    RemoveBlockHooks(const RemoveBlockHooks&) = delete;
    RemoveBlockHooks& operator=(const RemoveBlockHooks&) = delete;
    ~RemoveBlockHooks() { model.set_block_hooks(nullptr); }
    LanguageModel& model;
  };
  std::optional<RemoveBlockHooks> remove_block_hooks;
  const AdamW::Options adamw_options{opt.lr, opt.beta1, opt.beta2, opt.eps};
  if (sharded_run) {
    int group_size = opt.shard_group_size > 0 ? int(opt.shard_group_size) : world_size;
    HAM_CHECK(world_size % group_size == 0, "train: --shard-group-size ", group_size,
              " must divide the ", world_size, " ranks");
    if (auto* ham_model = dynamic_cast<HAMModel*>(&model)) {
      ham_model->set_threshold_all_reduce(dist::mean_over_ranks(world));
    }
    sharded = std::make_unique<dist::ShardedModel>(
        dist::group_parameters_by_layer(model.named_parameters()),
        dist::make_sharding_groups(world, group_size), stage);
    sharded_optimizer = std::make_unique<dist::ShardedAdamW>(
        *sharded, decay_groups(model.named_parameters(), opt.weight_decay), adamw_options);
    log << fmt::format("sharded data parallel: {} ranks, stage {}, {} shards x {} replicas, "
                       "{} rows per rank; per rank: {}\n",
                       world_size, dist::sharding_stage_name(stage), group_size,
                       world_size / group_size, local_rows,
                       sharded->memory_per_rank().str());
    if (stage == dist::ShardingStage::Full) {
      model.set_block_hooks(std::make_shared<dist::ShardedBlockHooks>(*sharded, model.config().n_layers));
      remove_block_hooks.emplace(model);
    }
  } else {
    optimizer = std::make_unique<AdamW>(decay_groups(model.named_parameters(), opt.weight_decay),
                                        adamw_options);
  }

  if (resume) {
    // A checkpoint's weights are the f32 masters: the bf16 parameters were loaded rounded,
    // the masters take the exact values.
    if (mixed_precision && sharded_run) {
      sharded->load_full_parameters(resume->model);
    } else if (mixed_precision) {
      optimizer->load_master_weights(resume->model);
    }
    const nlohmann::json& st = resume->state;
    const std::string checkpoint_dir = st.value("checkpoint_dir", std::string("?"));
    const int64_t optimizer_steps = st.at("optimizer_steps").get<int64_t>();
    // A sharded checkpoint keeps the moments in <dir>/<optimizer_shards>/, a one-process
    // one in optimizer.safetensors as "optimizer.exp_avg.<param>"; either resumes on any
    // number of ranks.
    const std::string shards_dir =
        st.contains("optimizer_shards")
            ? checkpoint_dir + "/" + st.at("optimizer_shards").get<std::string>()
            : "";
    if (sharded_run && !shards_dir.empty()) {
      dist::load_sharded_checkpoint(shards_dir, *sharded_optimizer);
    } else if (sharded_run) {
      dist::load_full_optimizer_state(*sharded_optimizer,
                                      strip_prefix("optimizer.", resume->optimizer),
                                      optimizer_steps);
    } else if (!shards_dir.empty()) {
      auto [state, steps] = dist::read_sharded_checkpoint_unsharded(shards_dir,
                                                                    model.named_parameters());
      optimizer->load_state(state, steps);
    } else {
      optimizer->load_state(strip_prefix("optimizer.", resume->optimizer), optimizer_steps);
    }
    model.load_training_state(strip_prefix("training.", resume->optimizer));
    data_gen.set_state(st.at("data_rng").at("seed").get<uint64_t>(),
                       st.at("data_rng").at("offset").get<uint64_t>());
    log << fmt::format("resumed from {} at step {}{}\n", checkpoint_dir, start_step,
                       shards_dir.empty() ? "" : " (sharded optimizer state)");
    resume.reset();  // the model and optimizer hold its values now
  } else if (has_val) {
    result.initial_val_loss =
        sharded_run ? evaluate_distributed(model, val_data, opt, *world)
                    : evaluate(model, val_data, opt.batch_size, opt.seq_len, opt.eval_batches);
    log << fmt::format("step {:>5}/{} | val loss {:.4f}\n", 0, opt.steps, result.initial_val_loss);
  }

  // The model's weights at full precision, in the model's order (bf16 parameters replaced
  // by their f32 masters).
  auto full_precision_weights = [&] {
    std::map<std::string, Tensor> masters;
    for (auto& [name, t] : optimizer->full_precision_parameters()) masters[name] = t;
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [name, p] : model.named_parameters()) {
      auto it = masters.find(name);
      out.emplace_back(name, it != masters.end() ? it->second : p);
    }
    return out;
  };

  // Wall time: this call's since here, after the earlier calls' the checkpoint recorded.
  const double earlier_seconds = result.train_seconds;
  auto wall_start = std::chrono::steady_clock::now();
  auto train_seconds_so_far = [&] {
    return earlier_seconds +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };
  int64_t checkpointed_step = start_step;  // a resumed run's start is a checkpoint already
  // Read once: every checkpoint keeps the tokenizer the data was encoded with at the start.
  const std::string tokenizer_json = opt.out_dir.empty() ? std::string() : tokenizer_file_text(opt.tokenizer);
  auto write_checkpoint = [&](int64_t step) {
    checkpointed_step = step;
    CheckpointContents c;
    c.model = sharded_run ? sharded->full_master_parameters() : full_precision_weights();
    c.optimizer = sharded_run ? std::vector<std::pair<std::string, Tensor>>{}
                              : with_prefix("optimizer.", optimizer->state());
    for (auto& entry : with_prefix("training.", model.training_state())) c.optimizer.push_back(entry);
    int64_t optimizer_steps =
        sharded_run ? sharded_optimizer->steps_taken() : optimizer->steps_taken();
    c.state = {{"step", step},
               {"optimizer_steps", optimizer_steps},
               {"data_rng", {{"seed", data_gen.seed()}, {"offset", data_gen.offset()}}},
               {"config", model.config().to_json()},
               {"train", opt.to_json()},
               {"train_loss", result.final_loss}};
    result.train_seconds = train_seconds_so_far();
    c.state["history"] = history_to_json(result);
    c.tokenizer_json = tokenizer_json;
    if (!sharded_run) {
      result.last_checkpoint = save_checkpoint(opt.out_dir, step, c, opt.keep_checkpoints);
    } else {
      // Rank 0 writes the step directory; every rank writes its optimizer shard into the
      // same temporary directory (named after rank 0's pid, so a dead writer's leftovers
      // are reaped) before rank 0 adds state.json and renames it into place.
      constexpr const char* kShardsDir = "optimizer";
      c.state["optimizer_shards"] = kShardsDir;
      c.state["world_size"] = world_size;
      const int64_t writer_pid = int64_t(world->all_reduce_scalar(
          rank == 0 ? double(::getpid()) : 0.0, dist::ReduceOp::Sum));
      auto write_shards = [&](const std::string& tmp_dir) {
        world->barrier();  // rank 0 has created tmp_dir
        dist::save_sharded_checkpoint(tmp_dir + "/" + kShardsDir, *sharded_optimizer);
      };
      if (rank == 0) {
        result.last_checkpoint = save_checkpoint(opt.out_dir, step, c, opt.keep_checkpoints,
                                                 write_shards);
      } else {
        write_shards(checkpoint_temporary_dir(opt.out_dir, step, writer_pid));
      }
      world->barrier();  // the step directory is in place
      if (rank != 0) result.last_checkpoint = opt.out_dir + fmt::format("/step-{:08d}", step);
    }
    log << fmt::format("step {:>5}/{} | checkpoint {}\n", step, opt.steps, result.last_checkpoint);
  };

  std::string log_dir = opt.log_dir.empty() ? opt.out_dir : opt.log_dir;
  std::unique_ptr<MetricsLogger> metrics;
  if (!log_dir.empty() && rank == 0) metrics = std::make_unique<MetricsLogger>(log_dir);
  // MFU's denominator: the given peak, else measured now (about 0.1 s), times the ranks: on a
  // GPU its GEMM peak in the compute dtype, on the CPU the fp32 FMA peak on the threads in
  // use.
  double peak_gflops = opt.peak_gflops;
  if (peak_gflops <= 0 && rank == 0 && device.is_cuda()) {
    peak_gflops = ops::measure_matmul_peak_flops(device, compute_dtype) * 1e-9;
    log << fmt::format("{} {} GEMM peak: {:.4g} TFLOP/s (measured)\n", device.str(),
                       dtype_name(compute_dtype), peak_gflops * 1e-3);
  } else if (peak_gflops <= 0 && rank == 0) {
    peak_gflops = cpu::measure_fma_peak_flops(omp_get_max_threads(), 5) * 1e-9;
    log << fmt::format("cpu fp32 FMA peak: {:.1f} GFLOP/s on {} threads ({}, measured)\n",
                       peak_gflops, omp_get_max_threads(), cpu::fma_isa());
  }
  peak_gflops *= double(world_size);
  wall_start = std::chrono::steady_clock::now();

  double window_loss = 0;
  int64_t window_steps = 0;
  int64_t window_tokens = 0;
  auto window_start = std::chrono::steady_clock::now();
  // Each progress line shows the peak of memory asked of the device since the line before.
  reset_peak_device_memory(device);

  // The op profile's steps: N of them, after the first where the run has more than N.
  const int64_t profile_first =
      opt.profile_steps > 0 && opt.steps - start_step > opt.profile_steps ? start_step + 1
                                                                            : start_step;
  const int64_t profile_end = std::min(opt.steps, profile_first + opt.profile_steps);
  int64_t profiled_steps = 0;
  struct StopProfileOnError {  // an error mid-profile must not leave it running
    ~StopProfileOnError() {
      if (!profiler::active()) return;
      try {
        profiler::stop();
      } catch (...) {  // the error that unwinds here is the one to report
      }
    }
  } stop_profile_on_error;
  auto finish_profile = [&] {
    if (!profiler::active()) return;
    const profiler::Profile profile = profiler::stop();
    if (rank != 0) return;
    log << profiler::format_table(profile, std::max<int64_t>(profiled_steps, 1));
    log << profiler::format_slowest_calls(profile, 10);
    std::string trace = opt.profile_trace;
    if (trace.empty() && !opt.out_dir.empty()) {
      trace = (std::filesystem::path(opt.out_dir) / "profile.json").string();
    }
    if (!trace.empty()) {
      profiler::write_chrome_trace(profile, trace);
      log << "profile trace: " << trace << " (chrome://tracing or ui.perfetto.dev)\n";
    }
  };

  for (int64_t step = start_step; step < opt.steps; ++step) {
    // A stop request (Ctrl-C, a preemption's SIGTERM) ends the run between steps, on every
    // rank at the same step, with the checkpoint a --resume continues from.
    int stop_signal = stop_requested();
    if (sharded_run) {
      stop_signal = int(world->all_reduce_scalar(double(stop_signal), dist::ReduceOp::Max));
    }
    if (stop_signal != 0) {
      result.stopped_by_signal = stop_signal;
      result.steps = step;
      log << fmt::format("step {:>5}/{} | stopping: {} received\n", step, opt.steps,
                         stop_signal_name(stop_signal));
      if (!opt.out_dir.empty() && step > checkpointed_step) {
        write_checkpoint(step);
      }
      break;
    }
    if (opt.profile_steps > 0 && step == profile_first) profiler::start();
    if (step == profile_end) finish_profile();  // where the window's last step was skipped
    double lr = schedule.lr(step);
    double step_loss = 0;
    bool nonfinite = false;
    std::string where;
    gradient_monitor.begin_step(step + 1);
    for (int64_t micro = 0; micro < opt.grad_accum; ++micro) {
      // Every rank draws the whole global batch (the same generator state everywhere) and
      // keeps its rows, so N ranks see exactly the rows one process would.
      TokenBatch batch = sample_rows(opt.batch_size, opt.seq_len, data_gen);
      if (!sharded_run) {
        batch = batch_on_device(batch, device);
        profiler::Phase forward_phase("forward");
        Tensor loss = model.loss(batch);
        double value = loss.item();
        if (!std::isfinite(value)) {
          nonfinite = true;
          where = fmt::format("loss is {} in the forward pass of micro-batch {}", value, micro);
          break;
        }
        step_loss += value / double(opt.grad_accum);
        backward(scale(loss, 1.0 / double(opt.grad_accum)));
      } else {
        TokenBatch local = batch_on_device(rows_of(batch, first_row, first_row + local_rows), device);
        // The loss is a mean over counted targets; weighting rank r's mean by
        // N c_r / C (c_r its counted targets, C the batch's) makes the rank average of
        // the losses and of the gradients the one-process mean. 1 when nothing is ignored.
        const double weight = double(world_size) * double(counted_targets(local.targets)) /
                              double(counted_targets(batch.targets));
        profiler::Phase forward_phase("forward");
        Tensor loss = model.loss(local);
        double value = world->all_reduce_scalar(loss.item() * weight, dist::ReduceOp::Avg);
        if (!std::isfinite(value)) {  // the same decision on every rank
          nonfinite = true;
          where = fmt::format("loss is {} in the forward pass of micro-batch {}", value, micro);
          break;
        }
        step_loss += value / double(opt.grad_accum);
        sharded->begin_backward();
        backward(scale(loss, weight / double(opt.grad_accum)));
        sharded->finish_backward();
      }
      gradient_monitor.after_micro_batch();
      window_tokens += opt.batch_size * opt.seq_len;
    }
    GradientCheck checked;  // unsharded: the norm the clipping takes, the gradients untouched
    if (!nonfinite) {
      profiler::Phase check_phase("nonfinite_check");
      if (sharded_run) {
        checked.first_nonfinite = sharded->first_non_finite_gradient();
      } else {
        checked = check_gradients(model);
      }
      const std::string& bad = checked.first_nonfinite;
      if (!bad.empty()) {
        nonfinite = true;
        where = "gradient of '" + bad + "' holds NaN or Inf";
      }
    }
    if (nonfinite) {
      gradient_monitor.abandon_step();
      if (sharded_run) {
        sharded->zero_gradients();
      } else {
        optimizer->zero_grad();
      }
      HAM_CHECK(opt.skip_nonfinite, "step ", step + 1, ": ", where,
                " (stopping; rerun with --skip-nonfinite to skip such steps)");
      log << fmt::format("step {:>5}/{} | skipped: {}\n", step + 1, opt.steps, where);
      ++result.skipped_steps;
      continue;
    }
    // The step's gradients are final here: norms and dumps see them before clipping.
    // Sharded, they exist only as shards: gathered whole for the steps the monitor reads.
    if (sharded_run && monitor_reads_gradients(step + 1)) {
      auto full = sharded->full_gradients();
      if (rank == 0) {
        std::map<std::string, Tensor> by_name(full.begin(), full.end());
        for (const auto& [name, p] : model.named_parameters()) set_grad(p, by_name.at(name));
      }
    }
    gradient_monitor.end_step(step + 1, log, metrics.get());
    double grad_norm = 0;
    // clip 0: no bound, the norm still measured for the progress line.
    const double max_norm = opt.clip > 0 ? opt.clip : std::numeric_limits<double>::infinity();
    {
      profiler::Phase optimizer_phase("optimizer");
      if (sharded_run) {
        for (const auto& [name, p] : model.named_parameters()) clear_grad(p);
        grad_norm = sharded->clip_gradient_norm(max_norm);
        sharded_optimizer->step(lr);
        sharded->zero_gradients();
      } else {
        // Clipped in the update's read of the gradients (AdamW::step's grad_scale).
        grad_norm = checked.norm;
        optimizer->step(lr, clip_factor(grad_norm, max_norm));
        optimizer->zero_grad();
      }
      model.after_optimizer_step(step + 1);
    }
    if (profiler::active()) ++profiled_steps;
    if (step + 1 == profile_end) finish_profile();
    if (result.step_losses.empty()) result.first_loss = step_loss;
    result.step_losses.push_back(step_loss);
    window_loss += step_loss;
    ++window_steps;
    result.steps = step + 1;

    bool last = step + 1 == opt.steps;
    if ((step + 1) % opt.log_every == 0 || last || step == start_step) {
      auto now = std::chrono::steady_clock::now();
      double seconds = std::chrono::duration<double>(now - window_start).count();
      double elapsed = std::chrono::duration<double>(now - wall_start).count();
      double eta = elapsed / double(step + 1 - start_step) * double(opt.steps - step - 1);
      double mean_loss = window_loss / double(window_steps);
      double tokens_per_second = double(window_tokens) / std::max(seconds, 1e-9);
      std::vector<LayerRouting> routing = model.routing();
      // Each rank routed its own rows: the fraction over the global batch is the mean.
      if (sharded_run) {
        for (LayerRouting& r : routing) {
          r.kv_fraction = world->all_reduce_scalar(r.kv_fraction, dist::ReduceOp::Avg);
        }
      }
      std::string kv;
      double mean_kv = 1.0;
      if (!routing.empty()) {
        mean_kv = 0;
        for (const LayerRouting& r : routing) mean_kv += r.kv_fraction / double(routing.size());
        kv = fmt::format(" | kv {:.3f}", mean_kv);
      }
      // Training FLOPs = 3 x the appendix's forward FLOPs per token at this T and KV use.
      double gflops = 3.0 * tokens_per_second * 1e-9 *
                      forward_flops_per_token(model.config(), SequenceShape::with_kv_fraction(
                                                                  double(opt.seq_len), mean_kv));
      std::string throughput = fmt::format("{:.0f} tok/s | {:.1f} GFLOP/s", tokens_per_second, gflops);
      throughput += fmt::format(" | mfu {:.1f}%", 100.0 * gflops / peak_gflops);
      // Under sharding, the largest rank's.
      double peak_memory = double(device_memory_stats(device).peak_requested_bytes);
      if (sharded_run) peak_memory = world->all_reduce_scalar(peak_memory, dist::ReduceOp::Max);
      reset_peak_device_memory(device);
      result.peak_memory_bytes = std::max(result.peak_memory_bytes, int64_t(peak_memory));
      const double peak_memory_mib = peak_memory / 1048576.0;
      log << fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {}{} | "
                         "mem {:.1f} MiB | eta {:.0f}s\n",
                         step + 1, opt.steps, mean_loss, lr, grad_norm, throughput, kv,
                         peak_memory_mib, eta);
      if (!routing.empty()) {
        std::string line = "           kv fraction by layer:";
        for (const LayerRouting& r : routing) {
          line += fmt::format(" {}:{:.3f}(tau {:.3f})", r.layer, r.kv_fraction, r.tau);
        }
        log << line << "\n";
      }
      if (metrics) {
        NamedScalars scalars = {{"train/loss", mean_loss}, {"train/lr", lr},
                                {"train/grad_norm", grad_norm}, {"train/tokens_per_second", tokens_per_second},
                                {"train/gflops", gflops},
                                {"train/peak_memory_mib", peak_memory_mib}};
        for (const LayerRouting& r : routing) {
          scalars.push_back({fmt::format("routing/kv_fraction/layer_{}", r.layer), r.kv_fraction});
          scalars.push_back({fmt::format("routing/tau/layer_{}", r.layer), r.tau});
        }
        metrics->log(step + 1, scalars);
      }
      log.flush();
      result.final_loss = mean_loss;
      window_loss = 0;
      window_steps = 0;
      window_tokens = 0;
      window_start = std::chrono::steady_clock::now();
    }
    if (has_val && ((opt.eval_every > 0 && (step + 1) % opt.eval_every == 0) || last)) {
      result.final_val_loss =
          sharded_run ? evaluate_distributed(model, val_data, opt, *world)
                      : evaluate(model, val_data, opt.batch_size, opt.seq_len, opt.eval_batches);
      log << fmt::format("step {:>5}/{} | val loss {:.4f}\n", step + 1, opt.steps, result.final_val_loss);
      if (metrics) metrics->log(step + 1, {{"val/loss", result.final_val_loss}});
    }
    if (!opt.out_dir.empty() &&
        (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0))) {
      write_checkpoint(step + 1);
    }
  }
  finish_profile();  // where the run's last step, the window's, was skipped
  result.train_seconds = train_seconds_so_far();
  if (sharded_run) {
    const int64_t peak = sharded->peak_gathered_parameter_bytes();
    const int64_t whole = sharded->full_parameter_bytes();
    log << fmt::format("sharded data parallel: peak gathered parameters {:.3f} MiB of {:.3f} MiB "
                       "({:.1f}%) on rank 0\n", double(peak) / 1048576.0,
                       double(whole) / 1048576.0, 100.0 * double(peak) / double(whole));
    // Leave the model whole for the caller (export, evaluation): "full" released it.
    sharded->gather_all();
  }
  // Mixed precision leaves the caller the f32 master weights.
  if (mixed_precision) {
    auto weights = sharded_run ? sharded->full_master_parameters() : full_precision_weights();
    model.to(DType::F32);
    model.load_parameters(weights);
  }
  return result;
}

}  // namespace ham
