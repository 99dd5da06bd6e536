// CUDA kernels of core/ops/reduce.h over the [outer, len, inner] view:
//   out[o, i]    = scale * sum_l in[o, l, i]      (f32 accumulation; f64 for f64)
//   dx[o, l, i]  = scale * dy[o, i]
// The sum is cuda/reduce_utils.cuh's deterministic middle-dim reduction.
#include <cstdint>

#include "core/ops/reduce.h"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

template <class T>
__global__ void spread_kernel(const T* dy, T* dx, int64_t len, int64_t inner, int64_t n,
                              compute_t<T> scale) {
  HAM_GRID_STRIDE_LOOP(idx, n) {
    const int64_t o = idx / (len * inner), i = idx % inner;
    dx[idx] = store<T>(scale * load(dy[o * inner + i]));
  }
}

void reduce_sum(const Tensor& in, Tensor& out, const ReduceDims& dims, double scale) {
  if (out.numel() == 0) return;
  use_device_of(in);
  dispatch_floating("sum", in.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    reduce_middle<C>(in.device(), dims.outer, dims.len, dims.inner,
                     ReadMiddle<T, C>{ptr<const T>(in), dims.len, dims.inner},
                     StoreScaled<T, C>{ptr<T>(out), C(scale)});
  });
}

void reduce_sum_backward(const Tensor& dy, Tensor& dx, const ReduceDims& dims, double scale) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  use_device_of(dy);
  dispatch_floating("sum backward", dy.dtype(), [&]<class T>() {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), spread_kernel)(
        ptr<const T>(dy), ptr<T>(dx), dims.len, dims.inner, n, compute_t<T>(scale));
    HAM_CUDA_CHECK_LAUNCH();
  });
}

const bool registered = [] {
  reduce_sum_kernels().register_kernel(DeviceKind::CUDA, &reduce_sum);
  reduce_sum_backward_kernels().register_kernel(DeviceKind::CUDA, &reduce_sum_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
