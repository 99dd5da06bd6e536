#pragma once
// cuBLASLt GEMM settings and handles (cuda/matmul.cu registers it as matmul's CUDA
// kernel). f32 products run in full fp32 unless TF32 is allowed: TF32 keeps 10 mantissa
// bits in the products (relative error ~1e-3 instead of ~1e-6) for the tensor cores'
// speed. bf16 products always accumulate in fp32.
#include <cublasLt.h>

#include <cstddef>

#include "core/tensor.h"

namespace ham::cuda {

// Default: off, or on when the environment sets HAM_ALLOW_TF32=1.
bool matmul_allows_tf32();
void set_matmul_allow_tf32(bool allow);

// One cuBLASLt handle per device, created on first use.
cublasLtHandle_t cublaslt_handle(int device);

// Workspace handed to cuBLASLt per (device, stream); 32 MiB is what Hopper kernels want.
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// Epilogues fused into the GEMM: out = act(op(A) op(B) + bias), bias [N] added to every
// row. kGeluBias is GELU's tanh approximation,
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class GemmEpilogue { kNone, kBias, kReluBias, kGeluBias };

// c = act(op(a) op(b) + bias) on the GPU in one cuBLASLt call; shapes as ops::matmul's,
// bias a [N] tensor of c's dtype and device (undefined for kNone). Throws one line naming
// the shapes when they do not fit.
void gemm_epilogue(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c, bool trans_a,
                   bool trans_b, GemmEpilogue epilogue);

// How many distinct GEMM shapes have a cached algorithm (for tests).
size_t gemm_plan_cache_size();

}  // namespace ham::cuda
