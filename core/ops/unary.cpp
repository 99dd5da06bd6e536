#include "core/ops/unary.h"

namespace ham {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Softplus: return "softplus";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Square: return "square";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Relu: return "relu";
  }
  return "unary";
}

UnarySaved unary_saves(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:      // f' = y
    case UnaryOp::Sigmoid:  // f' = y (1 - y)
    case UnaryOp::Tanh:     // f' = 1 - y^2
    case UnaryOp::Sqrt:     // f' = 1 / (2 y)
    case UnaryOp::Relu:     // f' = [y > 0]
      return UnarySaved::Output;
    case UnaryOp::Neg:  // f' = -1
      return UnarySaved::Nothing;
    default:  // log, silu, softplus, gelu, square: f' is a function of x
      return UnarySaved::Input;
  }
}

HAM_DEFINE_KERNEL_TABLE(unary, &cpu::unary, void(UnaryOp, const Tensor& x, Tensor& y))
HAM_DEFINE_KERNEL_TABLE(unary_backward, &cpu::unary_backward,
                        void(UnaryOp, const Tensor& dy, const Tensor& saved, Tensor& dx))

namespace ops {

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = unary_op_name(op);
  HAM_CHECK(x.defined(), name, ": input is an undefined tensor");
  HAM_CHECK(is_floating(x.dtype()), name, ": input must be floating point, got ", x.str());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_kernels()(x.device(), op, x, y);
  return y;
}

Tensor unary_backward(UnaryOp op, const Tensor& dy, const Tensor& saved) {
  const char* name = unary_op_name(op);
  const Tensor& read = unary_saves(op) == UnarySaved::Nothing ? dy : saved;
  HAM_CHECK(read.defined(), name, " backward: the saved tensor is undefined");
  check_same_shape(name, dy, read);
  HAM_CHECK(dy.dtype() == read.dtype(), name, " backward: dtypes differ (", dy.str(), " and ",
            read.str(), ")");
  check_same_device(name, dy, read);
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  unary_backward_kernels()(dy.device(), op, dy, read, dx);
  return dx;
}

}  // namespace ops
}  // namespace ham
