#include "core/ops/optim.h"

#include <cmath>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(adamw_step, &cpu::adamw_step,
                        void(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                             Tensor& exp_avg_sq, const AdamWHyper&))
HAM_DEFINE_KERNEL_TABLE(squared_norm, &cpu::squared_norm, double(const Tensor& x))

namespace ops {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& hyper) {
  check_same_shape("adamw_step (grad)", param, grad);
  check_same_shape("adamw_step (exp_avg)", param, exp_avg);
  check_same_shape("adamw_step (exp_avg_sq)", param, exp_avg_sq);
  HAM_CHECK(exp_avg.dtype() == exp_avg_sq.dtype(), "adamw_step: moment dtypes differ");
  HAM_CHECK(hyper.step >= 1, "adamw_step: step must be >= 1, got ", hyper.step);
  adamw_step_kernels()(param.device(), param, grad, exp_avg, exp_avg_sq, hyper);
}

double squared_norm(const Tensor& x) { return squared_norm_kernels()(x.device(), x); }

bool all_finite(const Tensor& x) { return std::isfinite(squared_norm(x)); }

}  // namespace ops
}  // namespace ham
