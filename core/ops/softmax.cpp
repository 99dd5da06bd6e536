#include "core/ops/softmax.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(softmax, &cpu::softmax, void(const Tensor& x, Tensor& y))
HAM_DEFINE_KERNEL_TABLE(log_softmax, &cpu::log_softmax, void(const Tensor& x, Tensor& y))
HAM_DEFINE_KERNEL_TABLE(softmax_backward, &cpu::softmax_backward,
                        void(const Tensor& y, const Tensor& dy, Tensor& dx))
HAM_DEFINE_KERNEL_TABLE(log_softmax_backward, &cpu::log_softmax_backward,
                        void(const Tensor& y, const Tensor& dy, Tensor& dx))

namespace ops {

namespace {

void check_input(const char* op, const Tensor& x) {
  HAM_CHECK(x.dim() >= 1, op, ": needs at least 1 dim, got ", x.str());
  HAM_CHECK(is_floating(x.dtype()), op, ": needs a floating tensor, got ", x.str());
}

void check_backward(const char* op, const Tensor& y, const Tensor& dy) {
  check_same_shape(op, y, dy);
  HAM_CHECK(y.dtype() == dy.dtype(), op, ": dtypes differ (", y.str(), " and ", dy.str(), ")");
  check_same_device(op, y, dy);
}

}  // namespace

Tensor softmax(const Tensor& x) {
  check_input("softmax", x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  softmax_kernels()(x.device(), x, y);
  return y;
}

Tensor log_softmax(const Tensor& x) {
  check_input("log_softmax", x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  log_softmax_kernels()(x.device(), x, y);
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  check_backward("softmax_backward", y, dy);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  softmax_backward_kernels()(y.device(), y, dy, dx);
  return dx;
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  check_backward("log_softmax_backward", y, dy);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  log_softmax_backward_kernels()(y.device(), y, dy, dx);
  return dx;
}

}  // namespace ops
}  // namespace ham
