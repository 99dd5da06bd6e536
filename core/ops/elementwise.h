#pragma once
// Element-wise binary ops with NumPy broadcasting, and the in-place helpers the autograd
// engine and optimizers use.
//   out[i] = a[bcast_a(i)] (op) b[bcast_b(i)],  op in {+, -, *, /}
// Shapes align from the right; a dim of size 1 (or a missing dim) stretches.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
const char* binary_op_name(BinaryOp op);

HAM_DECLARE_KERNEL_TABLE(binary, void(BinaryOp, const Tensor& a, const Tensor& b, Tensor& out));
// dst += alpha * src (same shape)
HAM_DECLARE_KERNEL_TABLE(axpy, void(double alpha, const Tensor& src, Tensor& dst));
// x *= alpha
HAM_DECLARE_KERNEL_TABLE(scale, void(double alpha, Tensor& x));
// out = sum of `in` over the dims where out_shape (right-aligned) has size 1 or is missing
HAM_DECLARE_KERNEL_TABLE(sum_to, void(const Tensor& in, Tensor& out));

namespace ops {

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
inline Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }

void axpy_(double alpha, const Tensor& src, Tensor& dst);  // dst += alpha * src
void scale_(Tensor& x, double alpha);                      // x *= alpha
Tensor scaled(const Tensor& x, double alpha);              // alpha * x (new tensor)
// Reduces a broadcast gradient back to `shape` (the inverse of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace ops

namespace cpu {
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void axpy(double alpha, const Tensor& src, Tensor& dst);
void scale(double alpha, Tensor& x);
void sum_to(const Tensor& in, Tensor& out);
}  // namespace cpu

}  // namespace ham
