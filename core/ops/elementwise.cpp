#include <cstdint>

#include "core/ops/elementwise.h"

namespace ham {

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
  }
  return "binary";
}

HAM_DEFINE_KERNEL_TABLE(binary, &cpu::binary,
                        void(BinaryOp, const Tensor& a, const Tensor& b, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(axpy, &cpu::axpy, void(double alpha, const Tensor& src, Tensor& dst))
HAM_DEFINE_KERNEL_TABLE(scale, &cpu::scale, void(double alpha, Tensor& x))
HAM_DEFINE_KERNEL_TABLE(sum_to, &cpu::sum_to, void(const Tensor& in, Tensor& out))

namespace ops {

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    HAM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
              shape_str(b), " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  Shape out_shape = broadcast_shapes(name, a.shape(), b.shape());
  HAM_CHECK(a.dtype() == b.dtype(), name, ": dtypes differ (", a.str(), " and ", b.str(), ")");
  check_same_device(name, a, b);
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  binary_kernels()(a.device(), op, a, b, out);
  return out;
}

void axpy_(double alpha, const Tensor& src, Tensor& dst) {
  check_same_shape("axpy_", dst, src);
  HAM_CHECK(src.dtype() == dst.dtype(), "axpy_: dtypes differ (", src.str(), " into ", dst.str(),
            ")");
  check_same_device("axpy_", src, dst);
  axpy_kernels()(dst.device(), alpha, src, dst);
}

void scale_(Tensor& x, double alpha) { scale_kernels()(x.device(), alpha, x); }

Tensor scaled(const Tensor& x, double alpha) {
  Tensor out = x.clone();
  scale_(out, alpha);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Shape check = broadcast_shapes("sum_to", x.shape(), shape);
  HAM_CHECK(check == x.shape(), "sum_to: cannot reduce ", shape_str(x.shape()), " to ",
            shape_str(shape));
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  sum_to_kernels()(x.device(), x, out);
  return out;
}

}  // namespace ops
}  // namespace ham
