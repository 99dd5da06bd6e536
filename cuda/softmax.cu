// CUDA kernels of core/ops/softmax.h, over rows of the last dim, max-subtracted:
//   softmax(x)_i     = exp(x_i - m) / s,   m = max_j x_j,  s = sum_j exp(x_j - m)
//   log_softmax(x)_i = x_i - m - log(s)
//   softmax backward:     dx = y (dy - sum_j dy_j y_j)
//   log_softmax backward: dx = dy - exp(y) sum_j dy_j     (-inf outputs: dx = 0, not summed)
// -inf inputs are masked entries; a row with no finite entry gives softmax 0 and
// log_softmax -inf (NaN entries stay NaN), exactly as the CPU kernel. One warp per row
// up to 1024 columns, one block per row beyond (a vocabulary); sums in f32 (f64 for f64).
#include <cmath>
#include <cstdint>

#include "core/ops/softmax.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }

template <bool kWarp>
__device__ __forceinline__ int64_t row_index() {
  return kWarp ? int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32 : int64_t(blockIdx.x);
}

template <bool kWarp, bool kLog, class T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const T* in = x + row * cols;
  T* out = y + row * cols;
  const C neg_inf = -INFINITY;
  C m = neg_inf;
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
    C v = load(in[j]);
    m = v > m ? v : m;  // NaN never wins, as on the CPU
  }
  m = Group::max(m, neg_inf);
  if (m == neg_inf) {
    for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
      C v = load(in[j]);
      out[j] = store<T>(v == neg_inf ? (kLog ? neg_inf : C(0)) : C(NAN));
    }
    return;
  }
  C sum = C(0);
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) sum += exp_(C(load(in[j])) - m);
  sum = Group::sum(sum);
  if constexpr (kLog) {
    const C log_sum = log_(sum);
    for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
      out[j] = store<T>((C(load(in[j])) - m) - log_sum);
    }
  } else {
    const C inv = C(1) / sum;
    for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
      out[j] = store<T>(exp_(C(load(in[j])) - m) * inv);
    }
  }
}

// softmax: dx = y (dy - <dy, y>)
template <bool kWarp, class T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows,
                                        int64_t cols) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const int64_t base = row * cols;
  C dot = C(0);
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
    dot += C(load(dy[base + j])) * C(load(y[base + j]));
  }
  dot = Group::sum(dot);
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
    dx[base + j] = store<T>(C(load(y[base + j])) * (C(load(dy[base + j])) - dot));
  }
}

// log_softmax: dx = dy - exp(y) sum(dy), masked (-inf) outputs neither take nor give.
template <bool kWarp, class T>
__global__ void log_softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows,
                                            int64_t cols) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const int64_t base = row * cols;
  const C neg_inf = -INFINITY;
  C sum = C(0);
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
    if (C(load(y[base + j])) != neg_inf) sum += load(dy[base + j]);
  }
  sum = Group::sum(sum);
  for (int64_t j = Group::lane(); j < cols; j += Group::size()) {
    const C v = load(y[base + j]);
    dx[base + j] = store<T>(v == neg_inf ? C(0) : C(load(dy[base + j])) - exp_(v) * sum);
  }
}

template <bool kLog>
void forward_rows(const char* op, const Tensor& x, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  use_device_of(x);
  dispatch_floating(op, x.dtype(), [&]<class T>() {
    launch_rows(rows, cols, &softmax_forward_kernel<true, kLog, T>,
                &softmax_forward_kernel<false, kLog, T>, ptr<const T>(x), ptr<T>(y), rows, cols);
  });
}

void softmax(const Tensor& x, Tensor& y) { forward_rows<false>("softmax", x, y); }
void log_softmax(const Tensor& x, Tensor& y) { forward_rows<true>("log_softmax", x, y); }

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  const int64_t cols = y.size(-1), rows = y.numel() / cols;
  use_device_of(y);
  dispatch_floating("softmax_backward", y.dtype(), [&]<class T>() {
    launch_rows(rows, cols, &softmax_backward_kernel<true, T>, &softmax_backward_kernel<false, T>,
                ptr<const T>(y), ptr<const T>(dy), ptr<T>(dx), rows, cols);
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  const int64_t cols = y.size(-1), rows = y.numel() / cols;
  use_device_of(y);
  dispatch_floating("log_softmax_backward", y.dtype(), [&]<class T>() {
    launch_rows(rows, cols, &log_softmax_backward_kernel<true, T>,
                &log_softmax_backward_kernel<false, T>, ptr<const T>(y), ptr<const T>(dy),
                ptr<T>(dx), rows, cols);
  });
}

const bool registered = [] {
  softmax_kernels().register_kernel(DeviceKind::CUDA, &softmax);
  log_softmax_kernels().register_kernel(DeviceKind::CUDA, &log_softmax);
  softmax_backward_kernels().register_kernel(DeviceKind::CUDA, &softmax_backward);
  log_softmax_backward_kernels().register_kernel(DeviceKind::CUDA, &log_softmax_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
