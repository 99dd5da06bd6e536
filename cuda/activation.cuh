#pragma once
// The sigmoid family shared by the CUDA kernels that apply it: the unary ops
// (cuda/unary.cu), the short conv's fused SiLU (cuda/conv1d.cu) and SwiGLU (cuda/swiglu.cu).
//   sigmoid(x) = 1 / (1 + e^-x)      silu(x) = x sigmoid(x)
//   silu'(x)   = sigmoid(x) (1 + x (1 - sigmoid(x)))
#include <cmath>

#include "cuda/launch.h"

namespace ham::cuda {

// e^x in the compute type: the full-precision expf for f32 (not the __expf intrinsic),
// exp for f64.
__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return ::exp(x); }

// sigmoid(x), evaluating e^t only for t <= 0 so it never overflows (as the CPU).
template <class C>
__device__ __forceinline__ C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + exp_of(-x));
  const C e = exp_of(x);
  return e / (C(1) + e);
}

template <class C>
__device__ __forceinline__ C silu(C x) {
  return x * sigmoid(x);
}

// dy silu'(x).
template <class C>
__device__ __forceinline__ C silu_grad(C dy, C x) {
  const C s = sigmoid(x);
  return dy * s * (C(1) + x * (C(1) - s));
}

}  // namespace ham::cuda
