#pragma once
// AdamW with parameter groups, a warmup + cosine learning-rate schedule, and global
// gradient-norm clipping. Defaults are the paper's (lr 1e-4, betas 0.9/0.95, eps 1e-15,
// weight decay 0.1, 1,024 warmup steps, clip 1.0).
#include <string>
#include <utility>
#include <vector>

#include "core/ops/optim.h"
#include "core/tensor.h"

namespace ham {

struct ParamGroup {
  std::string name;  // "decay", "no_decay", "thresholds", ...
  std::vector<std::pair<std::string, Tensor>> params;
  double weight_decay = 0.1;
  double lr_scale = 1.0;  // group lr = schedule lr * lr_scale
};

// Matrices (dim >= 2) decay; vectors (norm weights, biases, gates) do not.
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& params,
                                     double weight_decay);

// Mixed precision: a bf16 parameter gets an f32 master copy. The update runs on the master
// (f32 moments, the bf16 gradient read as f32) and the parameter is the master rounded to
// bf16 after every step (written by the update's own call, adamw_step_multi's rounded
// copies), so small updates accumulate in f32 instead of vanishing in bf16 rounding.
// Parameters of other dtypes are updated in place with moments of their dtype.
class AdamW {
 public:
  struct Options {
    double lr = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-15;
  };
  AdamW(std::vector<ParamGroup> groups, Options options);

  // One update of every parameter that has a gradient, at learning rate `lr`: one
  // ops::adamw_step_multi call per (group lr, weight decay, dtypes, device), so groups with
  // equal hyper-parameters share a call (one fused launch on CUDA). Each gradient is read as
  // grad_scale * grad and left as it is: clip_factor's clipping, done in the update's own
  // read of the gradients (clip_grad_norm then step(lr) scales them in place first, a pass
  // and, on CUDA, a launch a tensor more).
  void step(double lr, double grad_scale = 1.0);
  void zero_grad();
  int64_t steps_taken() const { return step_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  // Moments as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>") for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken);

  // Every parameter at full precision: the f32 master of a bf16 parameter, the parameter
  // itself otherwise (in group order). What a checkpoint saves as the model's weights.
  std::vector<std::pair<std::string, Tensor>> full_precision_parameters() const;
  // Sets the masters from full-precision values (a checkpoint's weights; names looked up,
  // parameters without a master or a value are left alone) and rounds the parameters to
  // them, so a resumed bf16 run continues from the exact f32 weights.
  void load_master_weights(const std::vector<std::pair<std::string, Tensor>>& weights);

 private:
  std::vector<ParamGroup> groups_;
  Options options_;
  std::vector<std::vector<Tensor>> exp_avg_, exp_avg_sq_;  // [group][param]
  std::vector<std::vector<Tensor>> master_;  // [group][param]; undefined unless bf16
  int64_t step_ = 0;
};

// Linear warmup from 0 to peak over warmup_steps, then cosine decay to min_lr at
// total_steps (held there after).
struct CosineSchedule {
  double peak_lr = 1e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 1024;
  int64_t total_steps = 100000;
  double lr(int64_t step) const;  // step counts from 0
};

// The global L2 norm of the parameters' gradients (those without one are skipped): the
// square root of their squared norms (one ops::squared_norms call) summed in order. NaN or
// Inf where some gradient is not finite.
double gradient_norm(const std::vector<Tensor>& params);

// What clipping to max_norm multiplies the gradients by: max_norm / norm where the norm is
// above max_norm, else 1 (also where the norm is not finite).
double clip_factor(double norm, double max_norm);

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm
// before clipping (NaN/Inf if some gradient is not finite: nothing is scaled then).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace ham
