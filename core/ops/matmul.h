#pragma once
// General matrix multiply, the one op every layer leans on.
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b],   op(X) = X or X^T by flag.
// A is [..., M, K] ([..., K, M] with trans_a); B is [..., K, N] ([..., N, K] with trans_b)
// or 2-D, in which case the same B serves every batch (a Linear layer's weight).
// GEMMs take transpose flags instead of strided inputs, so every operand stays contiguous.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // elements; 0 = shared across batch
  double alpha = 1.0, beta = 0.0;
};

HAM_DECLARE_KERNEL_TABLE(gemm, void(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape&));

namespace ops {

// Returns op(A) @ op(B) with shape [..., M, N].
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// In place: c = alpha * op(A) @ op(B) + beta * c; c must already have shape [..., M, N],
// the operands' dtype, or f32 for bf16 operands (accumulating bf16 products into f32).
void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
          double alpha = 1.0, double beta = 0.0);

// The GemmShape for the operands (also validates them; throws naming both shapes).
GemmShape gemm_shape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// The device's GEMM peak in `dtype`, measured: the trainer's MFU denominator on a GPU (on
// the CPU it is the FMA peak, cpu::measure_fma_peak_flops). Square GEMMs of random
// operands, n doubling from 256 until one GEMM takes 2 ms or n is 8192; then the best of
// `trials` runs of 4 GEMMs at that n, each run ended by a read of its last result (which
// waits for the device). Best, not mean: a disturbance only slows a run down.
double measure_matmul_peak_flops(Device device, DType dtype, int trials = 5);

}  // namespace ops

namespace cpu {
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& shape);
}

}  // namespace ham
