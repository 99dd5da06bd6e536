#include "core/ops/optim.h"

#include <cmath>
#include <string>
#include <vector>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(adamw_step, &cpu::adamw_step,
                        void(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                             Tensor& exp_avg_sq, const AdamWHyper&))
HAM_DEFINE_KERNEL_TABLE(adamw_step_multi, &cpu::adamw_step_multi,
                        void(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                             std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                             std::vector<Tensor>& rounded, const AdamWHyper&))
HAM_DEFINE_KERNEL_TABLE(squared_norm, &cpu::squared_norm, double(const Tensor& x))
HAM_DEFINE_KERNEL_TABLE(squared_norms, &cpu::squared_norms,
                        std::vector<double>(const std::vector<Tensor>& xs))

namespace ops {

namespace {

void check_grad_scale(const char* op, const AdamWHyper& hyper) {
  HAM_CHECK(std::isfinite(hyper.grad_scale) && hyper.grad_scale >= 0, op,
            ": grad_scale must be finite and >= 0, got ", hyper.grad_scale);
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& hyper) {
  check_same_shape("adamw_step (grad)", param, grad);
  check_same_shape("adamw_step (exp_avg)", param, exp_avg);
  check_same_shape("adamw_step (exp_avg_sq)", param, exp_avg_sq);
  HAM_CHECK(exp_avg.dtype() == exp_avg_sq.dtype(), "adamw_step: moment dtypes differ");
  HAM_CHECK(hyper.step >= 1, "adamw_step: step must be >= 1, got ", hyper.step);
  check_grad_scale("adamw_step", hyper);
  adamw_step_kernels()(param.device(), param, grad, exp_avg, exp_avg_sq, hyper);
}

void adamw_step_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                      const AdamWHyper& hyper, const std::vector<Tensor>& rounded) {
  constexpr const char* op = "adamw_step_multi";
  HAM_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() &&
                exp_avg_sq.size() == params.size() &&
                (rounded.empty() || rounded.size() == params.size()),
            op, ": the lists differ in length: ", params.size(), " params, ", grads.size(),
            " grads, ", exp_avg.size(), " exp_avg, ", exp_avg_sq.size(), " exp_avg_sq",
            rounded.empty() ? "" : ", " + std::to_string(rounded.size()) + " rounded");
  HAM_CHECK(hyper.step >= 1, op, ": step must be >= 1, got ", hyper.step);
  check_grad_scale(op, hyper);
  if (params.empty()) return;
  struct List {
    const char* name;
    const std::vector<Tensor>* tensors;
  };
  std::vector<List> lists = {{"params", &params}, {"grads", &grads}, {"exp_avg", &exp_avg},
                             {"exp_avg_sq", &exp_avg_sq}};
  if (!rounded.empty()) {
    lists.push_back({"rounded", &rounded});
    HAM_CHECK(params[0].dtype() == DType::F32 && rounded[0].defined() &&
                  rounded[0].dtype() == DType::BF16,
              op, ": rounded copies are bf16 copies of f32 params; got params[0] ",
              dtype_name(params[0].dtype()), " and rounded[0] ",
              rounded[0].defined() ? dtype_name(rounded[0].dtype()) : "undefined");
  }
  for (const List& list : lists) {
    for (size_t i = 0; i < list.tensors->size(); ++i) {
      HAM_CHECK((*list.tensors)[i].defined(), op, ": ", list.name, "[", i, "] is undefined");
    }
  }
  const Device device = params[0].device();
  for (size_t i = 0; i < params.size(); ++i) {
    for (const List& list : lists) {
      const Tensor& t = (*list.tensors)[i];
      // The dtype every entry of this list must have: its entry 0's (exp_avg_sq: exp_avg's).
      const bool second_moment = list.tensors == &exp_avg_sq;
      const Tensor& first = second_moment ? exp_avg[0] : (*list.tensors)[0];
      const char* first_name = second_moment ? "exp_avg" : list.name;
      HAM_CHECK(t.shape() == params[i].shape(), op, ": ", list.name, "[", i, "] has shape ",
                shape_str(t.shape()), " but params[", i, "] has shape ",
                shape_str(params[i].shape()));
      HAM_CHECK(t.dtype() == first.dtype(), op, ": ", list.name, "[", i, "] is ",
                dtype_name(t.dtype()), " but ", first_name, "[0] is ", dtype_name(first.dtype()),
                second_moment ? " (both moments share one dtype)" : " (one dtype per list)");
      HAM_CHECK(t.device() == device, op, ": ", list.name, "[", i, "] is on ", t.device().str(),
                " but params[0] is on ", device.str(), " (one device for every tensor)");
    }
  }
  // An output list (a non-const reference): on the CPU the bf16 widening writes it back.
  std::vector<Tensor> copies = rounded;
  adamw_step_multi_kernels()(device, params, grads, exp_avg, exp_avg_sq, copies, hyper);
}

double squared_norm(const Tensor& x) { return squared_norm_kernels()(x.device(), x); }

std::vector<double> squared_norms(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  for (size_t i = 0; i < xs.size(); ++i) {
    HAM_CHECK(xs[i].defined(), "squared_norms: tensor ", i, " is undefined");
    HAM_CHECK(is_floating(xs[i].dtype()), "squared_norms: tensor ", i, " is ", xs[i].str(),
              ", not floating");
    HAM_CHECK(xs[i].device() == xs[0].device(), "squared_norms: tensor ", i, " is on ",
              xs[i].device().str(), " but tensor 0 is on ", xs[0].device().str(),
              " (one device for every tensor)");
  }
  return squared_norms_kernels()(xs[0].device(), xs);
}

bool all_finite(const Tensor& x) { return std::isfinite(squared_norm(x)); }

}  // namespace ops
}  // namespace ham
