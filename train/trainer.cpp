#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/cpu/fma_peak.h"
#include "core/ops/optim.h"
#include "models/accounting.h"
#include "nn/elementwise.h"
#include "nn/optim.h"
#include "train/metrics_log.h"
#include "train/synthetic.h"

namespace ham {

double evaluate(const LanguageModel& model, const TokenSource& data, int64_t batch,
                int64_t seq_len, int64_t max_batches) {
  NoGradGuard no_grad;
  std::vector<TokenBatch> batches = data.sequential(batch, seq_len, max_batches);
  HAM_CHECK(!batches.empty(), "evaluate: the validation stream (", data.size(),
            " tokens) is shorter than one window of ", seq_len + 1);
  double total = 0;
  for (const TokenBatch& b : batches) total += model.loss(b).item();
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
          {"peak_gflops", peak_gflops}};
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
  auto get = [&](const char* key, auto& field) { field = merged.at(key).get<std::decay_t<decltype(field)>>(); };
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
  get("peak_gflops", o.peak_gflops);
  *this = o;
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
  if (opt.mix_mqar <= 0 && opt.mix_niah <= 0) return from_data;
  HAM_CHECK(opt.mix_mqar >= 0 && opt.mix_niah >= 0 && opt.mix_mqar + opt.mix_niah < 1,
            "train options: mix_mqar + mix_niah must lie in [0, 1), got ", opt.mix_mqar, " + ",
            opt.mix_niah);
  std::vector<MixtureSource> sources = {{"data", 1 - opt.mix_mqar - opt.mix_niah, from_data}};
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

// Name of the first parameter whose gradient holds a NaN or Inf, or "".
std::string first_nonfinite_grad(const LanguageModel& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = grad(p);
    if (g.defined() && !ops::all_finite(g)) return name;
  }
  return "";
}

}  // namespace

TrainResult train(LanguageModel& model, const TokenSource& train_data,
                  const TokenSource& val_data, const TrainOptions& opt, std::ostream& log,
                  const CheckpointContents* resume) {
  HAM_CHECK(opt.steps > 0 && opt.batch_size > 0 && opt.seq_len > 0 && opt.grad_accum > 0,
            "train: steps, batch size, sequence length and grad accumulation must be positive");
  Generator data_gen(opt.seed);
  AdamW optimizer(decay_groups(model.named_parameters(), opt.weight_decay),
                  {opt.lr, opt.beta1, opt.beta2, opt.eps});
  CosineSchedule schedule{opt.lr, opt.lr * opt.min_lr_ratio, opt.warmup_steps, opt.steps};
  std::vector<Tensor> params = model.parameters();
  auto sample_rows = make_row_sampler(train_data, opt, model.config());
  bool has_val = val_data.size() > opt.seq_len + 1;

  TrainResult result;
  int64_t start_step = 0;
  if (resume) {
    const nlohmann::json& st = resume->state;
    start_step = st.at("step").get<int64_t>();
    model.load_parameters(resume->model);
    optimizer.load_state(strip_prefix("optimizer.", resume->optimizer),
                         st.at("optimizer_steps").get<int64_t>());
    model.load_training_state(strip_prefix("training.", resume->optimizer));
    data_gen.set_state(st.at("data_rng").at("seed").get<uint64_t>(),
                       st.at("data_rng").at("offset").get<uint64_t>());
    log << fmt::format("resumed from {} at step {}\n", st.value("checkpoint_dir", std::string("?")),
                       start_step);
    HAM_CHECK(start_step < opt.steps, "train: the checkpoint is at step ", start_step,
              ", nothing left to do for --steps ", opt.steps);
  } else if (has_val) {
    result.initial_val_loss = evaluate(model, val_data, opt.batch_size, opt.seq_len, opt.eval_batches);
    log << fmt::format("step {:>5}/{} | val loss {:.4f}\n", 0, opt.steps, result.initial_val_loss);
  }

  auto write_checkpoint = [&](int64_t step) {
    CheckpointContents c;
    c.model = model.named_parameters();
    c.optimizer = with_prefix("optimizer.", optimizer.state());
    for (auto& entry : with_prefix("training.", model.training_state())) c.optimizer.push_back(entry);
    c.state = {{"step", step},
               {"optimizer_steps", optimizer.steps_taken()},
               {"data_rng", {{"seed", data_gen.seed()}, {"offset", data_gen.offset()}}},
               {"config", model.config().to_json()},
               {"train", opt.to_json()},
               {"train_loss", result.final_loss}};
    result.last_checkpoint = save_checkpoint(opt.out_dir, step, c, opt.keep_checkpoints);
    log << fmt::format("step {:>5}/{} | checkpoint {}\n", step, opt.steps, result.last_checkpoint);
  };

  std::string log_dir = opt.log_dir.empty() ? opt.out_dir : opt.log_dir;
  std::unique_ptr<MetricsLogger> metrics;
  if (!log_dir.empty()) metrics = std::make_unique<MetricsLogger>(log_dir);
  // MFU's denominator: the given peak, else this CPU's fp32 FMA peak on the threads in use,
  // measured now (about 0.1 s).
  double peak_gflops = opt.peak_gflops;
  if (peak_gflops <= 0) {
    peak_gflops = cpu::measure_fma_peak_flops(omp_get_max_threads(), 5) * 1e-9;
    log << fmt::format("cpu fp32 FMA peak: {:.1f} GFLOP/s on {} threads ({}, measured)\n",
                       peak_gflops, omp_get_max_threads(), cpu::fma_isa());
  }
  auto wall_start = std::chrono::steady_clock::now();

  double window_loss = 0;
  int64_t window_steps = 0;
  int64_t window_tokens = 0;
  auto window_start = std::chrono::steady_clock::now();

  for (int64_t step = start_step; step < opt.steps; ++step) {
    double lr = schedule.lr(step);
    double step_loss = 0;
    bool nonfinite = false;
    std::string where;
    for (int64_t micro = 0; micro < opt.grad_accum; ++micro) {
      TokenBatch batch = sample_rows(opt.batch_size, opt.seq_len, data_gen);
      Tensor loss = model.loss(batch);
      double value = loss.item();
      if (!std::isfinite(value)) {
        nonfinite = true;
        where = fmt::format("loss is {} in the forward pass of micro-batch {}", value, micro);
        break;
      }
      step_loss += value / double(opt.grad_accum);
      backward(scale(loss, 1.0 / double(opt.grad_accum)));
      window_tokens += opt.batch_size * opt.seq_len;
    }
    if (!nonfinite) {
      std::string bad = first_nonfinite_grad(model);
      if (!bad.empty()) {
        nonfinite = true;
        where = "gradient of '" + bad + "' holds NaN or Inf";
      }
    }
    if (nonfinite) {
      optimizer.zero_grad();
      HAM_CHECK(opt.skip_nonfinite, "step ", step + 1, ": ", where,
                " (stopping; rerun with --skip-nonfinite to skip such steps)");
      log << fmt::format("step {:>5}/{} | skipped: {}\n", step + 1, opt.steps, where);
      ++result.skipped_steps;
      continue;
    }
    double grad_norm = clip_grad_norm(params, opt.clip);
    optimizer.step(lr);
    optimizer.zero_grad();
    model.after_optimizer_step(step + 1);
    if (step == start_step) result.first_loss = step_loss;
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
      log << fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {}{} | eta {:.0f}s\n",
                         step + 1, opt.steps, mean_loss, lr, grad_norm, throughput, kv, eta);
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
                                {"train/gflops", gflops}};
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
    if (has_val && ((step + 1) % opt.eval_every == 0 || last)) {
      result.final_val_loss = evaluate(model, val_data, opt.batch_size, opt.seq_len, opt.eval_batches);
      log << fmt::format("step {:>5}/{} | val loss {:.4f}\n", step + 1, opt.steps, result.final_val_loss);
      if (metrics) metrics->log(step + 1, {{"val/loss", result.final_val_loss}});
    }
    if (!opt.out_dir.empty() &&
        (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0))) {
      write_checkpoint(step + 1);
    }
  }
  return result;
}

}  // namespace ham
