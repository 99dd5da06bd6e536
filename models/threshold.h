#pragma once
// HAM's routing threshold: select_t = [e_t >= tau_l], with tau_l = s * sigmoid(p_tau_l)
// (logit space, so an optimizer moves p_tau freely while tau stays in (0, s)); s = 2 for
// the cosine fit error (which lies in [0, 2]) and 1 for the learned routers (in (0, 1)).
//
// Fixed tau: p_tau = logit(tau / s) from the config, never updated.
// Learned tau (the paper's Algorithm 2, synthetic gradients): selection is not
// differentiable, so p_tau gets no gradient from the loss. Instead, after every training
// forward, per layer l:
//   f_i   = selected tokens / tokens of sequence i (a row of the batch)
//   gap_l = mean_i (f_i - target_l)                       local batch
//   gap_l = all_reduce_mean(gap_l)                        across data-parallel ranks
//   g_l   = clamp(-gain * gap_l, -clip, clip)             d tau / d p_tau dropped
//   p_tau_l.grad += g_l
// and after each main optimizer step p_tau takes one step of its own AdamW (lr tau_lr,
// betas (0.9, 0.999), eps 1e-8, no weight decay), except during the first
// tau_freeze_steps steps, when the threshold stays where it is. Too many selected tokens
// (gap > 0) give a negative gradient, so AdamW raises tau.
//
// p_tau is not a model parameter: requires_grad stays false (the main optimizer, gradient
// clipping and DDP never see it), and checkpoints reach it through the model's
// threshold_state(). The parameter table counts it as 1 per layer when learned.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/optim.h"

namespace ham {

class Threshold {
 public:
  Threshold(double tau, double scale);
  double tau() const;  // s * sigmoid(p_tau)
  void set_tau(double tau);  // p_tau = logit(tau / s); tau must lie in (0, s)
  double scale() const { return scale_; }
  const Tensor& p_tau() const { return p_tau_; }  // [1] f32, shared with the controller

 private:
  double scale_;
  Tensor p_tau_;
};

struct ThresholdLearningOptions {
  std::vector<double> targets;  // kv fraction target per layer
  double gain = 1.0;            // gamma of Algorithm 2
  double clip = 1.0;            // c of Algorithm 2
  double lr = 2.5e-4;
  int64_t freeze_steps = 0;
};

// Algorithm 2 over all layers of one model.
class ThresholdController {
 public:
  // `p_taus`: each layer's (name, p_tau), in layer order; one target per layer.
  ThresholdController(std::vector<std::pair<std::string, Tensor>> p_taus,
                      ThresholdLearningOptions options);

  // After a training forward: the kv fraction of each sequence, per layer.
  void record_forward(const std::vector<std::vector<double>>& fractions_per_layer);
  // After the main optimizer's step `step` (counting from 1): inject the synthetic
  // gradients of the forwards recorded since the last call and take one AdamW step,
  // unless step <= freeze_steps. Returns whether the thresholds moved.
  bool after_optimizer_step(int64_t step);

  // clamp(-gain * gap, -clip, clip)
  static double synthetic_gradient(double gap, double gain, double clip);

  // Cross-rank mean of a per-rank value; identity on one rank. Distributed training sets it
  // (every rank must then call after_optimizer_step after the same number of forwards).
  std::function<double(double)> all_reduce_mean = [](double local) { return local; };

  const ThresholdLearningOptions& options() const { return options_; }
  AdamW& optimizer() { return optimizer_; }
  const AdamW& optimizer() const { return optimizer_; }
  // Local mean gaps of the forwards not yet applied, [forward][layer].
  const std::vector<std::vector<double>>& pending_gaps() const { return pending_gaps_; }

 private:
  std::vector<std::pair<std::string, Tensor>> p_taus_;
  ThresholdLearningOptions options_;
  AdamW optimizer_;
  std::vector<std::vector<double>> pending_gaps_;
};

}  // namespace ham
