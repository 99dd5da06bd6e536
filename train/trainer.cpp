#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/ops/optim.h"
#include "nn/elementwise.h"
#include "nn/optim.h"

namespace ham {

double evaluate(const LanguageModel& model, const TokenStream& data, int64_t batch,
                int64_t seq_len, int64_t max_batches) {
  NoGradGuard no_grad;
  std::vector<TokenBatch> batches = data.sequential(batch, seq_len, max_batches);
  HAM_CHECK(!batches.empty(), "evaluate: the validation stream (", data.size(),
            " tokens) is shorter than one window of ", seq_len + 1);
  double total = 0;
  for (const TokenBatch& b : batches) total += model.loss(b).item();
  return total / double(batches.size());
}

namespace {

// Name of the first parameter whose gradient holds a NaN or Inf, or "".
std::string first_nonfinite_grad(const LanguageModel& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = grad(p);
    if (g.defined() && !ops::all_finite(g)) return name;
  }
  return "";
}

}  // namespace

TrainResult train(LanguageModel& model, const TokenStream& train_data,
                  const TokenStream& val_data, const TrainOptions& opt, std::ostream& log) {
  HAM_CHECK(opt.steps > 0 && opt.batch_size > 0 && opt.seq_len > 0 && opt.grad_accum > 0,
            "train: steps, batch size, sequence length and grad accumulation must be positive");
  Generator data_gen(opt.seed);
  AdamW optimizer(decay_groups(model.named_parameters(), opt.weight_decay),
                  {opt.lr, opt.beta1, opt.beta2, opt.eps});
  CosineSchedule schedule{opt.lr, opt.lr * opt.min_lr_ratio, opt.warmup_steps, opt.steps};
  std::vector<Tensor> params = model.parameters();
  bool has_val = val_data.size() > opt.seq_len + 1;

  TrainResult result;
  if (has_val) {
    result.initial_val_loss = evaluate(model, val_data, opt.batch_size, opt.seq_len, opt.eval_batches);
    log << fmt::format("step {:>5}/{} | val loss {:.4f}\n", 0, opt.steps, result.initial_val_loss);
  }
  double window_loss = 0;
  int64_t window_steps = 0;
  int64_t window_tokens = 0;
  auto window_start = std::chrono::steady_clock::now();

  for (int64_t step = 0; step < opt.steps; ++step) {
    double lr = schedule.lr(step);
    double step_loss = 0;
    bool nonfinite = false;
    std::string where;
    for (int64_t micro = 0; micro < opt.grad_accum; ++micro) {
      TokenBatch batch = train_data.sample(opt.batch_size, opt.seq_len, data_gen);
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
    if (step == 0) result.first_loss = step_loss;
    window_loss += step_loss;
    ++window_steps;
    result.steps = step + 1;

    bool last = step + 1 == opt.steps;
    if ((step + 1) % opt.log_every == 0 || last || step == 0) {
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      double mean_loss = window_loss / double(window_steps);
      log << fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s\n",
                         step + 1, opt.steps, mean_loss, lr, grad_norm,
                         double(window_tokens) / std::max(seconds, 1e-9));
      std::vector<LayerRouting> routing = model.routing();
      if (!routing.empty()) {
        std::string line = "           kv fraction by layer:";
        for (const LayerRouting& r : routing) {
          line += fmt::format(" {}:{:.3f}(tau {:.3f})", r.layer, r.kv_fraction, r.tau);
        }
        log << line << "\n";
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
    }
  }
  return result;
}

}  // namespace ham
