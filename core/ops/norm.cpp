#include <cstdint>

#include "core/ops/norm.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(rms_norm, &cpu::rms_norm,
                        void(const Tensor& x, const Tensor& gate, const Tensor& weight,
                             double eps, Tensor& y, Tensor& rstd))
HAM_DEFINE_KERNEL_TABLE(rms_norm_backward, &cpu::rms_norm_backward,
                        void(const Tensor& dy, const Tensor& x, const Tensor& gate,
                             const Tensor& weight, const Tensor& rstd, Tensor& dx,
                             Tensor& dgate, Tensor& dweight))
HAM_DEFINE_KERNEL_TABLE(l2_norm, &cpu::l2_norm,
                        void(const Tensor& x, double eps, Tensor& y, Tensor& rstd))
HAM_DEFINE_KERNEL_TABLE(l2_norm_backward, &cpu::l2_norm_backward,
                        void(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dx))

namespace ops {

namespace {

void check_input(const char* op, const Tensor& x) {
  HAM_CHECK(x.defined(), op, ": input is an undefined tensor");
  HAM_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim (normalizes the last), got ",
            x.str());
  HAM_CHECK(is_floating(x.dtype()), op, ": input must be floating point, got ", x.str());
}

// `arg` (gate or weight) must match x's dtype and device.
void check_like_input(const char* op, const char* arg, const Tensor& t, const Tensor& x) {
  HAM_CHECK(t.dtype() == x.dtype(), op, ": ", arg, " ", t.str(), " and input ", x.str(),
            " have different dtypes");
  check_same_device(op, t, x);
}

int64_t rows_of(const Tensor& x) {
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  return shape_numel(lead);
}

}  // namespace

NormResult rms_norm(const char* op, const Tensor& x, const Tensor& gate, const Tensor& weight,
                    double eps) {
  check_input(op, x);
  if (weight.defined()) {
    HAM_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": weight ",
              shape_str(weight.shape()), " does not match input ", shape_str(x.shape()),
              " (expected [", x.size(-1), "])");
    check_like_input(op, "weight", weight, x);
  }
  if (gate.defined()) {
    HAM_CHECK(gate.shape() == x.shape(), op, ": gate ", shape_str(gate.shape()),
              " does not match input ", shape_str(x.shape()));
    check_like_input(op, "gate", gate, x);
  }
  NormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.rstd = Tensor::empty({rows_of(x)}, x.dtype(), x.device());
  rms_norm_kernels()(x.device(), x, gate, weight, eps, r.y, r.rstd);
  return r;
}

RmsNormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                               const Tensor& weight, const Tensor& rstd, bool want_dx,
                               bool want_dgate, bool want_dweight) {
  check_same_shape("rms_norm backward", dy, x);
  HAM_CHECK(dy.dtype() == x.dtype(), "rms_norm backward: gradient ", dy.str(), " and input ",
            x.str(), " have different dtypes");
  RmsNormGrads g;
  if (want_dx) g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (want_dgate && gate.defined()) g.dgate = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (want_dweight && weight.defined()) {
    g.dweight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
  }
  if (!g.dx.defined() && !g.dgate.defined() && !g.dweight.defined()) return g;
  rms_norm_backward_kernels()(x.device(), dy, x, gate, weight, rstd, g.dx, g.dgate, g.dweight);
  return g;
}

NormResult l2_norm(const Tensor& x, double eps) {
  check_input("l2_norm", x);
  NormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.rstd = Tensor::empty({rows_of(x)}, x.dtype(), x.device());
  l2_norm_kernels()(x.device(), x, eps, r.y, r.rstd);
  return r;
}

Tensor l2_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd) {
  check_same_shape("l2_norm backward", dy, x);
  HAM_CHECK(dy.dtype() == x.dtype(), "l2_norm backward: gradient ", dy.str(), " and input ",
            x.str(), " have different dtypes");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  l2_norm_backward_kernels()(x.device(), dy, x, rstd, dx);
  return dx;
}

}  // namespace ops
}  // namespace ham
