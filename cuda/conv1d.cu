// CUDA kernels of core/ops/conv1d.h, the short causal depthwise convolution. x [B, T, C],
// weight [C, W], bias [C] optional, doc_ids [B, T] optional:
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] x[b, t - (W-1) + j, c]
// with taps before the start of t's document dropped (a document starts at t = 0 and
// wherever doc_ids changes). Backward, over the same kept taps (s = t - (W-1) + j):
//   dx[b, s, c]   = sum_j weight[c, j] dy[b, s + (W-1) - j, c]
//   dweight[c, j] = sum_{b,t} dy[b, t, c] x[b, t - (W-1) + j, c],   dbias[c] = sum_{b,t} dy[b, t, c]
// Each thread finds how far its row reaches back (forward, dweight) or ahead (dx) inside
// its document by reading at most W - 1 neighbouring ids. dweight and dbias are the
// deterministic column reductions of cuda/reduce_utils.cuh. The models apply SiLU after
// this op through the unary kernel (a fused conv + SiLU would save one round trip).
#include <cstdint>

#include "core/ops/conv1d.h"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

// Earlier steps of row (b, t)'s document, capped at `cap`. ids may be null.
template <class I>
__device__ __forceinline__ int64_t steps_back(const I* ids, int64_t row, int64_t t, int64_t cap) {
  int64_t past = 0;
  while (past < cap && t - past > 0 && (!ids || ids[row - past] == ids[row - past - 1])) ++past;
  return past;
}

// Steps from (b, t) to the end of its document, t included, capped at `cap`.
template <class I>
__device__ __forceinline__ int64_t steps_ahead(const I* ids, int64_t row, int64_t t, int64_t seq,
                                               int64_t cap) {
  int64_t ahead = 1;
  while (ahead < cap && t + ahead < seq && (!ids || ids[row + ahead] == ids[row + ahead - 1])) {
    ++ahead;
  }
  return ahead;
}

template <class T, class I>
__global__ void conv_forward(const T* x, const T* weight, const T* bias, const I* ids,
                             int64_t seq, int64_t channels, int64_t width, T* y, int64_t n) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(k, n) {
    const int64_t row = k / channels, c = k % channels, t = row % seq;
    const int64_t past = steps_back(ids, row, t, width - 1);
    C acc = bias ? C(load(bias[c])) : C(0);
    for (int64_t j = width - 1 - past; j < width; ++j) {
      acc += C(load(weight[c * width + j])) * C(load(x[(row - (width - 1) + j) * channels + c]));
    }
    y[k] = store<T>(acc);
  }
}

template <class T, class I>
__global__ void conv_backward_input(const T* dy, const T* weight, const I* ids, int64_t seq,
                                    int64_t channels, int64_t width, T* dx, int64_t n) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(k, n) {
    const int64_t row = k / channels, c = k % channels, t = row % seq;
    const int64_t ahead = steps_ahead(ids, row, t, seq, width);
    C acc = C(0);
    for (int64_t j = width - ahead; j < width; ++j) {
      acc += C(load(weight[c * width + j])) * C(load(dy[(row + (width - 1) - j) * channels + c]));
    }
    dx[k] = store<T>(acc);
  }
}

// value(0, row, c * W + j) = dy[row, c] x[row - (W-1) + j, c] for kept taps, else 0.
template <class T, class I>
struct WeightGradTerm {
  const T *dy, *x;
  const I* ids;
  int64_t seq, channels, width;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t col) const {
    using C = compute_t<T>;
    const int64_t c = col / width, j = col % width, t = row % seq;
    if (j < width - 1 - steps_back(ids, row, t, width - 1)) return C(0);
    return C(load(dy[row * channels + c])) * C(load(x[(row - (width - 1) + j) * channels + c]));
  }
};

template <class T>
struct BiasGradTerm {
  const T* dy;
  int64_t channels;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t c) const {
    return load(dy[row * channels + c]);
  }
};

// Calls fn(ids pointer) with the doc_ids' index type, or a null int64 pointer without them.
template <class Fn>
void with_doc_ids(const char* op, const Tensor& doc_ids, Fn&& fn) {
  if (!doc_ids.defined()) {
    fn(static_cast<const int64_t*>(nullptr));
    return;
  }
  dispatch_index(op, doc_ids.dtype(), [&]<class I>() { fn(ptr<const I>(doc_ids)); });
}

void causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& doc_ids, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t seq = x.size(1), channels = x.size(2), width = weight.size(1);
  use_device_of(x);
  dispatch_floating("causal_conv1d", x.dtype(), [&]<class T>() {
    with_doc_ids("causal_conv1d", doc_ids, [&]<class I>(const I* ids) {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), conv_forward)(
          ptr<const T>(x), ptr<const T>(weight), ptr_or_null<const T>(bias), ids, seq, channels,
          width, ptr<T>(y), n);
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

void causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& doc_ids, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const int64_t seq = x.size(1), channels = x.size(2), width = weight.size(1);
  const int64_t rows = x.size(0) * seq, n = x.numel();
  use_device_of(x);
  dispatch_floating("causal_conv1d_backward", x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    with_doc_ids("causal_conv1d_backward", doc_ids, [&]<class I>(const I* ids) {
      if (dx.defined() && n > 0) {
        HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), conv_backward_input)(
            ptr<const T>(dy), ptr<const T>(weight), ids, seq, channels, width, ptr<T>(dx), n);
        HAM_CUDA_CHECK_LAUNCH();
      }
      if (dweight.defined()) {
        reduce_middle<C>(x.device(), 1, rows, channels * width,
                         WeightGradTerm<T, I>{ptr<const T>(dy), ptr<const T>(x), ids, seq,
                                              channels, width},
                         StoreScaled<T, C>{ptr<T>(dweight), C(1)});
      }
      if (dbias.defined()) {
        reduce_middle<C>(x.device(), 1, rows, channels, BiasGradTerm<T>{ptr<const T>(dy), channels},
                         StoreScaled<T, C>{ptr<T>(dbias), C(1)});
      }
    });
  });
}

const bool registered = [] {
  causal_conv1d_kernels().register_kernel(DeviceKind::CUDA, &causal_conv1d);
  causal_conv1d_backward_kernels().register_kernel(DeviceKind::CUDA, &causal_conv1d_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
