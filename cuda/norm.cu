// CUDA kernels of core/ops/norm.h, rows of the last dim D (x viewed as [rows, D]):
// rms_norm (weight and gate optional):
//   rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x rstd,  n = xhat weight,  y = n silu(gate)
// backward, g = dy silu(gate) weight:
//   dx = rstd (g - xhat mean(g xhat)),   dgate = dy n silu'(gate),   dweight = sum_rows dy silu(gate) xhat
// l2_norm:  rstd = 1 / sqrt(sum(x^2) + eps),  y = x rstd,  dx = rstd (dy - x rstd^2 sum(dy x))
// One warp per row up to D = 1024, one block per row beyond; sums in f32 (f64 for f64).
// rms_norm moves 16-byte packs where D and the pointers allow.
// rstd is stored in x's dtype and, as on the CPU, the forward uses that rounded value so
// the backward sees the same xhat. dweight is the deterministic column reduction of
// cuda/reduce_utils.cuh.
#include <cstdint>
#include <initializer_list>

#include "core/ops/norm.h"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float rsqrt_(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_(double x) { return 1.0 / ::sqrt(x); }

template <class C>
__device__ __forceinline__ C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + exp_(-x));
  C e = exp_(x);
  return e / (C(1) + e);
}

template <bool kWarp>
__device__ __forceinline__ int64_t row_index() {
  return kWarp ? int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32 : int64_t(blockIdx.x);
}

// The rms_norm kernels move N elements at a time as one Pack (16 bytes when the row length
// is a multiple of the pack width and every pointer is 16-byte aligned; N = 1 otherwise).
template <bool kWarp, int N, class T>
__global__ void rms_norm_kernel(const T* x, const T* gate, const T* weight, int64_t rows,
                                int64_t d, compute_t<T> eps, T* y, T* rstd) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const int64_t packs = d / N;
  const P* xr = reinterpret_cast<const P*>(x + row * d);
  C sum_sq = C(0);
  for (int64_t p = Group::lane(); p < packs; p += Group::size()) {
    const P xp = xr[p];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const C v = load(xp.v[e]);
      sum_sq += v * v;
    }
  }
  sum_sq = Group::sum(sum_sq);
  const T r_stored = store<T>(rsqrt_(sum_sq / C(d) + eps));
  const C r = load(r_stored);
  if (Group::lane() == 0) rstd[row] = r_stored;
  const P* gr = reinterpret_cast<const P*>(gate ? gate + row * d : nullptr);
  const P* wr = reinterpret_cast<const P*>(weight);
  P* yr = reinterpret_cast<P*>(y + row * d);
  for (int64_t p = Group::lane(); p < packs; p += Group::size()) {
    const P xp = xr[p];
    const P wp = weight ? wr[p] : P{};
    const P gp = gate ? gr[p] : P{};
    P out;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      C n = load(xp.v[e]) * r;
      if (weight) n *= load(wp.v[e]);
      if (gate) {
        const C z = load(gp.v[e]);
        n *= z * sigmoid(z);
      }
      out.v[e] = store<T>(n);
    }
    yr[p] = out;
  }
}

// dx and dgate rows (either may be null).
template <bool kWarp, int N, class T>
__global__ void rms_norm_backward_kernel(const T* dy, const T* x, const T* gate, const T* weight,
                                         const T* rstd, int64_t rows, int64_t d, T* dx,
                                         T* dgate) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const int64_t packs = d / N, base = row * d;
  const P* xr = reinterpret_cast<const P*>(x + base);
  const P* dyr = reinterpret_cast<const P*>(dy + base);
  const P* gr = reinterpret_cast<const P*>(gate ? gate + base : nullptr);
  const P* wr = reinterpret_cast<const P*>(weight);
  const C r = load(rstd[row]);
  C dot = C(0);  // sum_j g_j xhat_j
  for (int64_t p = Group::lane(); p < packs; p += Group::size()) {
    const P xp = xr[p], dyp = dyr[p];
    const P wp = weight ? wr[p] : P{};
    const P gp = gate ? gr[p] : P{};
    P dgp;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const C xhat = load(xp.v[e]) * r;
      const C w = weight ? C(load(wp.v[e])) : C(1);
      const C g_in = load(dyp.v[e]);
      C g = g_in * w;
      if (gate) {
        const C z = load(gp.v[e]), s = sigmoid(z);
        dgp.v[e] = store<T>(g_in * xhat * w * s * (C(1) + z * (C(1) - s)));
        g *= z * s;
      }
      dot += g * xhat;
    }
    if (gate && dgate) reinterpret_cast<P*>(dgate + base)[p] = dgp;
  }
  if (!dx) return;
  const C mean_g_xhat = Group::sum(dot) / C(d);
  P* dxr = reinterpret_cast<P*>(dx + base);
  for (int64_t p = Group::lane(); p < packs; p += Group::size()) {
    const P xp = xr[p], dyp = dyr[p];
    const P wp = weight ? wr[p] : P{};
    const P gp = gate ? gr[p] : P{};
    P out;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const C xhat = load(xp.v[e]) * r;
      C g = load(dyp.v[e]) * (weight ? C(load(wp.v[e])) : C(1));
      if (gate) {
        const C z = load(gp.v[e]);
        g *= z * sigmoid(z);
      }
      out.v[e] = store<T>(r * (g - xhat * mean_g_xhat));
    }
    dxr[p] = out;
  }
}

// Whether rows of length d at these pointers (null ones ignored) can move as 16-byte packs.
template <class T>
bool rows_packable(int64_t d, std::initializer_list<const void*> pointers) {
  if (d % kPackWidth<T> != 0) return false;
  for (const void* p : pointers) {
    if (p && !aligned_16(p)) return false;
  }
  return true;
}

// value(0, row, j) = dy silu(gate) xhat, summed over rows for dweight_j.
template <class T>
struct WeightGradTerm {
  const T *dy, *x, *gate, *rstd;
  int64_t d;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t j) const {
    using C = compute_t<T>;
    const int64_t at = row * d + j;
    C dn = load(dy[at]);
    if (gate) {
      const C z = load(gate[at]);
      dn *= z * sigmoid(z);
    }
    return dn * (load(x[at]) * C(load(rstd[row])));
  }
};

template <bool kWarp, class T>
__global__ void l2_norm_kernel(const T* x, int64_t rows, int64_t d, compute_t<T> eps, T* y,
                               T* rstd) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const T* xr = x + row * d;
  C sum_sq = C(0);
  for (int64_t j = Group::lane(); j < d; j += Group::size()) {
    C v = load(xr[j]);
    sum_sq += v * v;
  }
  sum_sq = Group::sum(sum_sq);
  const T r_stored = store<T>(rsqrt_(sum_sq + eps));
  const C r = load(r_stored);
  if (Group::lane() == 0) rstd[row] = r_stored;
  for (int64_t j = Group::lane(); j < d; j += Group::size()) y[row * d + j] = store<T>(load(xr[j]) * r);
}

template <bool kWarp, class T>
__global__ void l2_norm_backward_kernel(const T* dy, const T* x, const T* rstd, int64_t rows,
                                        int64_t d, T* dx) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  const int64_t row = row_index<kWarp>();
  if (kWarp && row >= rows) return;
  const int64_t base = row * d;
  C dot = C(0);  // sum_j dy_j x_j
  for (int64_t j = Group::lane(); j < d; j += Group::size()) dot += load(dy[base + j]) * load(x[base + j]);
  dot = Group::sum(dot);
  const C r = load(rstd[row]);
  const C c = r * r * dot;
  for (int64_t j = Group::lane(); j < d; j += Group::size()) {
    dx[base + j] = store<T>(r * (load(dy[base + j]) - load(x[base + j]) * c));
  }
}

void rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight, double eps, Tensor& y,
              Tensor& rstd) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  if (rows == 0 || d == 0) return;
  use_device_of(x);
  dispatch_floating("rms_norm", x.dtype(), [&]<class T>() {
    const T *xp = ptr<const T>(x), *gp = ptr_or_null<const T>(gate),
            *wp = ptr_or_null<const T>(weight);
    T* yp = ptr<T>(y);
    if (rows_packable<T>(d, {xp, gp, wp, yp})) {
      constexpr int N = kPackWidth<T>;
      launch_rows(rows, d, &rms_norm_kernel<true, N, T>, &rms_norm_kernel<false, N, T>, xp, gp,
                  wp, rows, d, compute_t<T>(eps), yp, ptr<T>(rstd));
    } else {
      launch_rows(rows, d, &rms_norm_kernel<true, 1, T>, &rms_norm_kernel<false, 1, T>, xp, gp,
                  wp, rows, d, compute_t<T>(eps), yp, ptr<T>(rstd));
    }
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                       const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dgate,
                       Tensor& dweight) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  use_device_of(x);
  dispatch_floating("rms_norm backward", x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    if ((dx.defined() || dgate.defined()) && rows > 0 && d > 0) {
      const T *dyp = ptr<const T>(dy), *xp = ptr<const T>(x), *gp = ptr_or_null<const T>(gate),
              *wp = ptr_or_null<const T>(weight);
      T *dxp = ptr_or_null<T>(dx), *dgp = ptr_or_null<T>(dgate);
      if (rows_packable<T>(d, {dyp, xp, gp, wp, dxp, dgp})) {
        constexpr int N = kPackWidth<T>;
        launch_rows(rows, d, &rms_norm_backward_kernel<true, N, T>,
                    &rms_norm_backward_kernel<false, N, T>, dyp, xp, gp, wp,
                    ptr<const T>(rstd), rows, d, dxp, dgp);
      } else {
        launch_rows(rows, d, &rms_norm_backward_kernel<true, 1, T>,
                    &rms_norm_backward_kernel<false, 1, T>, dyp, xp, gp, wp,
                    ptr<const T>(rstd), rows, d, dxp, dgp);
      }
    }
    if (dweight.defined()) {
      reduce_middle<C>(x.device(), 1, rows, d,
                       WeightGradTerm<T>{ptr<const T>(dy), ptr<const T>(x),
                                         ptr_or_null<const T>(gate), ptr<const T>(rstd), d},
                       StoreScaled<T, C>{ptr<T>(dweight), C(1)});
    }
  });
}

void l2_norm(const Tensor& x, double eps, Tensor& y, Tensor& rstd) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  if (rows == 0 || d == 0) return;
  use_device_of(x);
  dispatch_floating("l2_norm", x.dtype(), [&]<class T>() {
    launch_rows(rows, d, &l2_norm_kernel<true, T>, &l2_norm_kernel<false, T>, ptr<const T>(x), rows, d, compute_t<T>(eps),
                    ptr<T>(y), ptr<T>(rstd));
  });
}

void l2_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dx) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  if (rows == 0 || d == 0) return;
  use_device_of(x);
  dispatch_floating("l2_norm backward", x.dtype(), [&]<class T>() {
    launch_rows(rows, d, &l2_norm_backward_kernel<true, T>, &l2_norm_backward_kernel<false, T>,
                ptr<const T>(dy), ptr<const T>(x),
                    ptr<const T>(rstd), rows, d, ptr<T>(dx));
  });
}

const bool registered = [] {
  rms_norm_kernels().register_kernel(DeviceKind::CUDA, &rms_norm);
  rms_norm_backward_kernels().register_kernel(DeviceKind::CUDA, &rms_norm_backward);
  l2_norm_kernels().register_kernel(DeviceKind::CUDA, &l2_norm);
  l2_norm_backward_kernels().register_kernel(DeviceKind::CUDA, &l2_norm_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
