#include "core/ops/rope.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(rope, &cpu::rope,
                        void(const Tensor& x, double base, const Tensor& positions, Tensor& y))
HAM_DEFINE_KERNEL_TABLE(rope_backward, &cpu::rope_backward,
                        void(const Tensor& dy, double base, const Tensor& positions, Tensor& dx))

namespace ops {

namespace {

void check_rope(const char* op, const Tensor& x, double base, const Tensor& positions) {
  HAM_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, op, ": x must be [B, T, H, D] with D even, got ",
            shape_str(x.shape()));
  HAM_CHECK(base > 0, op, ": base must be positive, got ", base);
  if (!positions.defined()) return;
  HAM_CHECK(positions.dtype() == DType::I32 || positions.dtype() == DType::I64, op,
            ": positions must be i32 or i64, got ", positions.str());
  HAM_CHECK(positions.shape() == Shape({x.size(0), x.size(1)}), op, ": positions ",
            shape_str(positions.shape()), " do not match x ", shape_str(x.shape()),
            " (expected [B, T])");
  check_same_device(op, x, positions);
}

}  // namespace

Tensor rope(const Tensor& x, double base, const Tensor& positions) {
  check_rope("rope", x, base, positions);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  rope_kernels()(x.device(), x, base, positions, y);
  return y;
}

Tensor rope_backward(const Tensor& dy, double base, const Tensor& positions) {
  check_rope("rope_backward", dy, base, positions);
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  rope_backward_kernels()(dy.device(), dy, base, positions, dx);
  return dx;
}

}  // namespace ops
}  // namespace ham
