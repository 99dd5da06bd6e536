// CUDA kernels of core/ops/rope.h, rotate-half convention. x [B, T, H, D], for i < D/2
// the pair (x_i, x_{i+D/2}) turns by a = sign * pos * base^(-2i/D):
//   y_i = x_i cos a - x_{i+D/2} sin a,      y_{i+D/2} = x_{i+D/2} cos a + x_i sin a
// sign = +1 forward, -1 backward (a rotation's inverse is its transpose).
// pos = positions[b, t] or t. As on the CPU, the angle, cos and sin are computed in f64:
// an f32 angle is already off by ~pos * 6e-8 rad, far above the f32 tolerance at long
// positions. One thread per (b, t, i) computes one sincos and turns the pair in every head.
#include <cstdint>

#include "core/ops/rope.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

template <class T, class I>
__global__ void rotate_kernel(const T* x, const I* positions, int64_t seq, int64_t heads,
                              int64_t dim, double base, double sign, T* y, int64_t n) {
  using C = compute_t<T>;
  const int64_t half = dim / 2;
  HAM_GRID_STRIDE_LOOP(k, n) {  // k = bt * half + i
    const int64_t bt = k / half, i = k % half;
    const double pos = positions ? double(positions[bt]) : double(bt % seq);
    const double inv_freq = pow(base, -2.0 * double(i) / double(dim));
    double s, c;
    sincos(pos * inv_freq, &s, &c);
    const C cos_a = C(c), sin_a = C(sign * s);
    const int64_t row = bt * heads * dim;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = row + h * dim + i;
      const C a = load(x[at]), b = load(x[at + half]);
      y[at] = store<T>(a * cos_a - b * sin_a);
      y[at + half] = store<T>(b * cos_a + a * sin_a);
    }
  }
}

void rotate(const char* op, const Tensor& x, double base, const Tensor& positions, double sign,
            Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t batch = x.size(0), seq = x.size(1), heads = x.size(2), dim = x.size(3);
  const int64_t n = batch * seq * (dim / 2);
  use_device_of(x);
  dispatch_floating(op, x.dtype(), [&]<class T>() {
    auto launch = [&]<class I>(const I* pos) {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), rotate_kernel)(
          ptr<const T>(x), pos, seq, heads, dim, base, sign, ptr<T>(y), n);
      HAM_CUDA_CHECK_LAUNCH();
    };
    if (!positions.defined()) {
      launch(static_cast<const int64_t*>(nullptr));
      return;
    }
    dispatch_index(op, positions.dtype(), [&]<class I>() { launch(ptr<const I>(positions)); });
  });
}

void rope(const Tensor& x, double base, const Tensor& positions, Tensor& y) {
  rotate("rope", x, base, positions, 1.0, y);
}

void rope_backward(const Tensor& dy, double base, const Tensor& positions, Tensor& dx) {
  rotate("rope_backward", dy, base, positions, -1.0, dx);
}

const bool registered = [] {
  rope_kernels().register_kernel(DeviceKind::CUDA, &rope);
  rope_backward_kernels().register_kernel(DeviceKind::CUDA, &rope_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
