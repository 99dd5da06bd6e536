#include "core/ops/swiglu.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(swiglu, &cpu::swiglu,
                        void(const Tensor& gate, const Tensor& up, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(swiglu_backward, &cpu::swiglu_backward,
                        void(const Tensor& dout, const Tensor& gate, const Tensor& up,
                             Tensor& dgate, Tensor& dup))

namespace ops {

namespace {

void check_pair(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                const char* b_name) {
  HAM_CHECK(a.defined() && b.defined(), op, ": ", a.defined() ? b_name : a_name,
            " is an undefined tensor");
  HAM_CHECK(is_floating(a.dtype()), op, ": ", a_name, " must be floating point, got ",
            a.str());
  HAM_CHECK(a.shape() == b.shape(), op, ": ", a_name, " ", shape_str(a.shape()), " and ",
            b_name, " ", shape_str(b.shape()), " differ in shape");
  HAM_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ (", a_name, " ", a.str(), ", ", b_name,
            " ", b.str(), ")");
  check_same_device(op, a, b);
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_pair("swiglu", gate, "gate", up, "up");
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  swiglu_kernels()(gate.device(), gate, up, out);
  return out;
}

SwigluGrads swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up,
                            bool want_dgate, bool want_dup) {
  check_pair("swiglu_backward", gate, "gate", up, "up");
  check_pair("swiglu_backward", dout, "dout", gate, "gate");
  SwigluGrads g;
  if (want_dgate) g.dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (want_dup) g.dup = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (want_dgate || want_dup) {
    swiglu_backward_kernels()(gate.device(), dout, gate, up, g.dgate, g.dup);
  }
  return g;
}

}  // namespace ops
}  // namespace ham
