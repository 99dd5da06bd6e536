// CUDA kernels of core/ops/swiglu.h, SwiGLU's gating (s = sigmoid(gate)):
//   out   = silu(gate) up
//   dgate = dout up s (1 + gate (1 - s)),   dup = dout silu(gate)
// Computed in f32 for f32/bf16 and f64 for f64, 16 bytes a load and a store where every
// tensor is 16-byte aligned (the forward through launch_map2).
#include <cstdint>

#include "core/ops/swiglu.h"
#include "cuda/activation.cuh"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

struct SwigluForward {
  template <class C>
  __device__ C operator()(C gate, C up) const {
    return silu(gate) * up;
  }
};

// Both gradients, or the one whose pointer is not null, N elements a thread at a time.
template <int N, class T>
__global__ void swiglu_backward_kernel(const T* dout, const T* gate, const T* up, T* dgate,
                                       T* dup, int64_t n) {
  using C = compute_t<T>;
  using P = Pack<T, N>;
  auto one = [&](T d, T g, T u, T& dg, T& du) {
    const C gc = load(g), dc = load(d);
    if (dup) du = store<T>(dc * silu(gc));
    if (dgate) dg = store<T>(silu_grad(dc * C(load(u)), gc));
  };
  const int64_t packs = n / N;
  HAM_GRID_STRIDE_LOOP(k, packs) {
    const P d = reinterpret_cast<const P*>(dout)[k], g = reinterpret_cast<const P*>(gate)[k];
    const P u = dgate ? reinterpret_cast<const P*>(up)[k] : P{};
    P dg, du;
#pragma unroll
    for (int e = 0; e < N; ++e) one(d.v[e], g.v[e], u.v[e], dg.v[e], du.v[e]);
    if (dgate) reinterpret_cast<P*>(dgate)[k] = dg;
    if (dup) reinterpret_cast<P*>(dup)[k] = du;
  }
  HAM_GRID_STRIDE_LOOP(k, n - packs * N) {
    const int64_t i = packs * N + k;
    T dg, du;
    one(dout[i], gate[i], dgate ? up[i] : gate[i], dg, du);
    if (dgate) dgate[i] = dg;
    if (dup) dup[i] = du;
  }
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  use_device_of(gate);
  dispatch_floating("swiglu", gate.dtype(), [&]<class T>() {
    launch_map2(ptr<const T>(gate), ptr<const T>(up), ptr<T>(out), gate.numel(),
                SwigluForward{});
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  use_device_of(gate);
  dispatch_floating("swiglu_backward", gate.dtype(), [&]<class T>() {
    const T *pd = ptr<const T>(dout), *pg = ptr<const T>(gate), *pu = ptr<const T>(up);
    T *pdg = ptr_or_null<T>(dgate), *pdu = ptr_or_null<T>(dup);
    const bool aligned = aligned_16(pd) && aligned_16(pg) && aligned_16(pu) &&
                         (!pdg || aligned_16(pdg)) && (!pdu || aligned_16(pdu));
    if (aligned) {
      constexpr int N = kPackWidth<T>;
      HAM_LAUNCH(grid_for(std::max<int64_t>(n / N, 1)), kThreads, 0, launch_stream(),
                 swiglu_backward_kernel<N, T>)(pd, pg, pu, pdg, pdu, n);
    } else {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), swiglu_backward_kernel<1, T>)(
          pd, pg, pu, pdg, pdu, n);
    }
    HAM_CUDA_CHECK_LAUNCH();
  });
}

const bool registered = [] {
  swiglu_kernels().register_kernel(DeviceKind::CUDA, &swiglu);
  swiglu_backward_kernels().register_kernel(DeviceKind::CUDA, &swiglu_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
