#pragma once
// The fit error from per-V-tile partial sums, for the gated delta rule kernels that split
// the value columns of a head across blocks (cuda/gated_delta_rule.cu's SIMT kernels and
// cuda/gated_delta_rule_decode.cu; the tensor-core output kernel adds its tiles' sums
// itself, through fit_error_of): each tile writes (<p, v>, ||p||^2, ||v||^2) over its
// columns to fit_part[row, tile, 0..2], and
//   fit_error[row] = 1 - <p, v> / (||p|| ||v|| + 1e-6)
// adds the tiles' sums in tile order (deterministic).
#include <cmath>
#include <cstdint>

#include "cuda/launch.h"

namespace ham::cuda {

inline constexpr double kFitEpsilon = 1e-6;

__device__ __forceinline__ float fit_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double fit_sqrt(double x) { return ::sqrt(x); }

// 1 - <p, v> / (||p|| ||v|| + 1e-6) from the sums over a row's columns.
template <class C>
__device__ __forceinline__ C fit_error_of(C pv, C pp, C vv) {
  return C(1) - pv / (fit_sqrt(pp) * fit_sqrt(vv) + C(kFitEpsilon));
}

template <class T, class C>
__global__ void fit_error_kernel(const C* fit_part, int64_t rows, int tiles, T* fit_error) {
  HAM_GRID_STRIDE_LOOP(row, rows) {
    C pv = C(0), pp = C(0), vv = C(0);
    for (int t = 0; t < tiles; ++t) {
      const C* part = fit_part + (row * tiles + t) * 3;
      pv += part[0];
      pp += part[1];
      vv += part[2];
    }
    fit_error[row] = store<T>(fit_error_of(pv, pp, vv));
  }
}

// fit_error [rows] (T) from fit_part [rows, tiles, 3] (the compute type of T).
template <class T>
void launch_fit_error(const Tensor& fit_part, int64_t rows, int tiles, Tensor& fit_error) {
  using C = compute_t<T>;
  if (rows == 0) return;
  HAM_LAUNCH(grid_for(rows), kThreads, 0, launch_stream(), fit_error_kernel<T, C>)(
      tiles > 0 ? ptr<const C>(fit_part) : nullptr, rows, tiles, ptr<T>(fit_error));
  HAM_CUDA_CHECK_LAUNCH();
}

}  // namespace ham::cuda
