// CUDA kernels of core/ops/unary.h, y = f(x) and dx = dy * f'(.):
//   exp e^x  (f' = y)          log ln x  (f' = 1/x)        sigmoid 1/(1+e^-x)  (f' = y (1-y))
//   silu x sig(x)  (f' = sig(x) (1 + x (1 - sig(x))))      softplus max(x,0) + log1p(e^-|x|)
//   (f' = sig(x))              gelu x Phi(x)  (f' = Phi(x) + x phi(x))
//   tanh (f' = 1 - y^2)        neg (f' = -1)  square (f' = 2x)  sqrt (f' = 1/(2y))
//   relu (f' = [y > 0])
// The gates of the models (softplus for the decay, sigmoid for beta and the output gate)
// are these ops. Computed in f32 for f32/bf16 and f64 for f64; the op is a uniform
// branch inside the kernel (memory-bound, so the switch costs nothing measurable), and
// loads and stores are 16-byte vectors when aligned (launch_map1/2 in cuda/launch.h).
#include <cstdint>

#include "core/ops/unary.h"
#include "cuda/activation.cuh"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

// Overloads so one template body serves f32 and f64 (the f32 ones are the full-precision
// CUDA functions, not the __fast intrinsics); exp's, exp_of, is cuda/activation.cuh's.
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }
__device__ __forceinline__ float log1p_(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p_(double x) { return ::log1p(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return ::tanh(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return ::sqrt(x); }
__device__ __forceinline__ float erf_(float x) { return erff(x); }
__device__ __forceinline__ double erf_(double x) { return ::erf(x); }


template <class C>
__device__ __forceinline__ C gelu_cdf(C x) {  // Phi(x) = 0.5 (1 + erf(x / sqrt 2))
  return C(0.5) * (C(1) + erf_(x * C(0.70710678118654752440)));
}

template <class C>
__device__ __forceinline__ C gelu_pdf(C x) {  // phi(x) = e^(-x^2 / 2) / sqrt(2 pi)
  return C(0.39894228040143267794) * exp_of(C(-0.5) * x * x);
}

template <class C>
__device__ __forceinline__ C forward(UnaryOp op, C v) {
  switch (op) {
    case UnaryOp::Exp: return exp_of(v);
    case UnaryOp::Log: return log_(v);
    case UnaryOp::Sigmoid: return sigmoid(v);
    case UnaryOp::Silu: return silu(v);
    case UnaryOp::Softplus: return (v > C(0) ? v : C(0)) + log1p_(exp_of(-fabs(v)));
    case UnaryOp::Gelu: return v * gelu_cdf(v);
    case UnaryOp::Tanh: return tanh_(v);
    case UnaryOp::Neg: return -v;
    case UnaryOp::Square: return v * v;
    case UnaryOp::Sqrt: return sqrt_(v);
    case UnaryOp::Relu: return v > C(0) ? v : C(0);
  }
  return C(0);
}

// g = dy, s = x or y as unary_saves(op) says (ignored for neg).
template <class C>
__device__ __forceinline__ C backward(UnaryOp op, C g, C s) {
  switch (op) {
    case UnaryOp::Exp: return g * s;
    case UnaryOp::Log: return g / s;
    case UnaryOp::Sigmoid: return g * s * (C(1) - s);
    case UnaryOp::Silu: return silu_grad(g, s);
    case UnaryOp::Softplus: return g * sigmoid(s);
    case UnaryOp::Gelu: return g * (gelu_cdf(s) + s * gelu_pdf(s));
    case UnaryOp::Tanh: return g * (C(1) - s * s);
    case UnaryOp::Neg: return -g;
    case UnaryOp::Square: return C(2) * s * g;
    case UnaryOp::Sqrt: return g / (C(2) * s);
    case UnaryOp::Relu: return s > C(0) ? g : C(0);
  }
  return C(0);
}

template <class C>
struct ForwardFn {
  UnaryOp op;
  __device__ C operator()(C x) const { return forward<C>(op, x); }
};

// For neg, `saved` is dy itself (ops::unary_backward passes dy) and is ignored.
template <class C>
struct BackwardFn {
  UnaryOp op;
  __device__ C operator()(C g, C s) const { return backward<C>(op, g, s); }
};

void unary(UnaryOp op, const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  use_device_of(x);
  dispatch_floating(unary_op_name(op), x.dtype(), [&]<class T>() {
    launch_map1(ptr<const T>(x), ptr<T>(y), n, ForwardFn<compute_t<T>>{op});
  });
}

void unary_backward(UnaryOp op, const Tensor& dy, const Tensor& saved, Tensor& dx) {
  const int64_t n = dy.numel();
  if (n == 0) return;
  use_device_of(dy);
  dispatch_floating(unary_op_name(op), dy.dtype(), [&]<class T>() {
    launch_map2(ptr<const T>(dy), ptr<const T>(saved), ptr<T>(dx), n,
                BackwardFn<compute_t<T>>{op});
  });
}

const bool registered = [] {
  unary_kernels().register_kernel(DeviceKind::CUDA, &unary);
  unary_backward_kernels().register_kernel(DeviceKind::CUDA, &unary_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
