#pragma once
// Optimizer kernels.
//   adamw_step (decoupled weight decay, Loshchilov & Hutter), g = grad_scale * grad:
//     p <- p (1 - lr wd)
//     m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
//     p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//   adamw_step_multi: the same update for lists of tensors in one call (one fused launch
//     on CUDA, cuda/optim.cu; a loop over the per-tensor kernel on the CPU, so the results
//     are bit-identical to adamw_step on each tensor). Entry i is (params[i], grads[i],
//     exp_avg[i], exp_avg_sq[i]), all of one shape; every list has one dtype (the moments
//     share theirs) and every tensor lives on one device. Optionally `rounded`, a bf16
//     list for f32 params: rounded[i] <- params[i] after the update, rounded to nearest
//     even, in the same pass (mixed precision's bf16 parameters from their f32 masters,
//     where a cast a tensor after the update reads every master again, 675 launches a
//     step for the paper's HAM).
//   squared_norm: sum of g^2, accumulated in double.
//   squared_norms: squared_norm of each tensor of a list in one call, read back at once (on
//     CUDA one launch a dtype and one copy to the host, where a loop over squared_norm
//     waits for the GPU once a tensor: 2 x 723 waits a step for the paper's HAM's
//     gradients, 17% of its step on the H200); on the CPU the loop over squared_norm, so
//     the values are bit-identical to it there.
#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

struct AdamWHyper {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-15, weight_decay = 0.1;
  int64_t step = 1;  // 1-based, for bias correction
  // Each gradient is read as grad_scale * grad: gradient clipping's factor, applied in the
  // update's one read of the gradients instead of a pass of its own. 1 leaves them exact.
  double grad_scale = 1.0;
};

HAM_DECLARE_KERNEL_TABLE(adamw_step, void(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                          Tensor& exp_avg_sq, const AdamWHyper&));
HAM_DECLARE_KERNEL_TABLE(adamw_step_multi,
                         void(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                              std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                              std::vector<Tensor>& rounded, const AdamWHyper&));
HAM_DECLARE_KERNEL_TABLE(squared_norm, double(const Tensor& x));
HAM_DECLARE_KERNEL_TABLE(squared_norms, std::vector<double>(const std::vector<Tensor>& xs));

namespace ops {
void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& hyper);
// Checks the lists (equal lengths, shapes, one dtype per list, one device; errors name the
// op, the entry and the mismatch; `rounded`, where not empty, is bf16 for f32 params), then
// updates every entry with one kernel call.
void adamw_step_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                      const AdamWHyper& hyper, const std::vector<Tensor>& rounded = {});
double squared_norm(const Tensor& x);
// Checks that every tensor is defined, floating and on the first one's device (errors name
// the entry); dtypes may differ.
std::vector<double> squared_norms(const std::vector<Tensor>& xs);
// True when every element is finite (no NaN or Inf).
bool all_finite(const Tensor& x);
}  // namespace ops

namespace cpu {
void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& hyper);
void adamw_step_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                      std::vector<Tensor>& rounded, const AdamWHyper& hyper);
double squared_norm(const Tensor& x);
std::vector<double> squared_norms(const std::vector<Tensor>& xs);
}  // namespace cpu

}  // namespace ham
