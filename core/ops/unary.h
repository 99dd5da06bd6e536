#pragma once
// Element-wise unary math y = f(x) and its backward dx = dy * f'(x):
//   exp e^x            log ln x           sigmoid 1 / (1 + e^-x)   silu x sigmoid(x)
//   softplus ln(1 + e^x) = max(x, 0) + log1p(e^-|x|)              gelu 0.5 x (1 + erf(x / sqrt 2))
//   tanh               neg -x             square x^2               sqrt   relu max(x, 0)
// The backward reads x or y, whichever gives f' cheapest (see unary_saves).
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

enum class UnaryOp : uint8_t {
  Exp, Log, Sigmoid, Silu, Softplus, Gelu, Tanh, Neg, Square, Sqrt, Relu
};
const char* unary_op_name(UnaryOp op);  // "exp", "log", ...

// What the backward kernel needs to form f': the input x, the output y, or nothing.
enum class UnarySaved : uint8_t { Input, Output, Nothing };
UnarySaved unary_saves(UnaryOp op);

HAM_DECLARE_KERNEL_TABLE(unary, void(UnaryOp, const Tensor& x, Tensor& y));
// dx = dy * f'(.) evaluated from `saved` (x or y per unary_saves; ignored for Nothing).
HAM_DECLARE_KERNEL_TABLE(unary_backward,
                         void(UnaryOp, const Tensor& dy, const Tensor& saved, Tensor& dx));

namespace ops {

Tensor unary(UnaryOp op, const Tensor& x);
// `saved` may be undefined when unary_saves(op) is Nothing.
Tensor unary_backward(UnaryOp op, const Tensor& dy, const Tensor& saved);

}  // namespace ops

namespace cpu {
void unary(UnaryOp op, const Tensor& x, Tensor& y);
void unary_backward(UnaryOp op, const Tensor& dy, const Tensor& saved, Tensor& dx);
}  // namespace cpu

}  // namespace ham
