// CUDA kernels of core/ops/norm.h, rows of the last dim D (x viewed as [rows, D]):
// rms_norm (weight and gate optional):
//   rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x rstd,  n = xhat weight,  y = n silu(gate)
// backward, g = dy silu(gate) weight:
//   dx = rstd (g - xhat mean(g xhat)),   dgate = dy n silu'(gate),   dweight = sum_rows dy silu(gate) xhat
// l2_norm:  rstd = 1 / sqrt(sum(x^2) + eps),  y = x rstd,  dx = rstd (dy - x rstd^2 sum(dy x))
// One warp per row up to D = 1024, one block per row beyond; sums in f32 (f64 for f64).
// rms_norm moves 16-byte packs where D and the pointers allow.
// rstd is stored in x's dtype and, as on the CPU, the forward uses that rounded value so
// the backward sees the same xhat. The backward's row groups keep dweight's partial sums in
// registers, read from the same loads as dx (rows 256 to 8192 long), and
// cuda/reduce_utils.cuh adds the groups' sums in order: deterministic.
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

// dx and dgate rows (either may be null), and with kPacks > 0 this group's share of
// dweight. Group g (a warp or a block) takes rows g, g + groups, ...; with kPacks > 0 each
// thread keeps dweight's partial sums for its kPacks packs of columns in registers (the row
// must fit: packs <= kPacks * group size) and writes them to dweight_part[g][:] at the end,
// so x and dy are read for dweight in the same pass as for dx; rms_norm_backward then adds
// the groups in order (PartialSum).
template <bool kWarp, int N, int kPacks, class T>
__global__ void rms_norm_backward_kernel(const T* dy, const T* x, const T* gate, const T* weight,
                                         const T* rstd, int64_t rows, int64_t d, int64_t groups,
                                         T* dx, T* dgate, compute_t<T>* dweight_part) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  const int64_t group = row_index<kWarp>();
  if (group >= groups) return;  // whole warps (kWarp) or whole blocks
  const int64_t packs = d / N;
  const P* wr = reinterpret_cast<const P*>(weight);
  C part[kPacks > 0 ? kPacks : 1][N] = {};
  for (int64_t row = group; row < rows; row += groups) {
    const int64_t base = row * d;
    const P* xr = reinterpret_cast<const P*>(x + base);
    const P* dyr = reinterpret_cast<const P*>(dy + base);
    const P* gr = reinterpret_cast<const P*>(gate ? gate + base : nullptr);
    const C r = load(rstd[row]);
    C dot = C(0);  // sum_j g_j xhat_j
    // Pack p: dot, dgate, and (k >= 0) dweight's terms dy silu(gate) xhat into part[k].
    auto first_pass = [&](int64_t p, int k) {
      const P xp = xr[p], dyp = dyr[p];
      const P wp = weight ? wr[p] : P{};
      const P gp = gate ? gr[p] : P{};
      P dgp;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const C xhat = load(xp.v[e]) * r;
        const C w = weight ? C(load(wp.v[e])) : C(1);
        const C g_in = load(dyp.v[e]);
        C g = g_in * w, dn = g_in;  // dn = dy silu(gate), g = dn w
        if (gate) {
          const C z = load(gp.v[e]), s = sigmoid(z);
          dgp.v[e] = store<T>(g_in * xhat * w * s * (C(1) + z * (C(1) - s)));
          g *= z * s;
          dn *= z * s;
        }
        dot += g * xhat;
        if constexpr (kPacks > 0) {
          if (k >= 0) part[k][e] += dn * xhat;
        }
      }
      if (gate && dgate) reinterpret_cast<P*>(dgate + base)[p] = dgp;
    };
    if constexpr (kPacks > 0) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t p = Group::lane() + int64_t(k) * Group::size();
        if (p < packs) first_pass(p, k);
      }
    } else {
      for (int64_t p = Group::lane(); p < packs; p += Group::size()) first_pass(p, -1);
    }
    if (!dx) continue;  // the same in the whole group
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
  if constexpr (kPacks > 0) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = Group::lane() + int64_t(k) * Group::size();
      if (p >= packs) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) dweight_part[group * d + p * N + e] = part[k][e];
    }
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

// Row groups of the fused backward: at most this many warps (rows up to kWarpRowMax) or
// blocks, each taking every groups-th row. Fixed numbers, so dweight's sums are the same
// on every device and run. Rows shorter than kFusedMinLength keep one warp per row and the
// second pass: with fewer warps than rows, too few loads would be in flight for them.
constexpr int64_t kBackwardWarpGroups = 2048, kBackwardBlockGroups = 512;
constexpr int64_t kFusedMinLength = 256;

// Launches rms_norm_backward_kernel<kWarp, N, kPacks> over min(rows, max_groups) groups.
template <bool kWarp, int N, int kPacks, class T>
void launch_rms_norm_backward(const T* dy, const T* x, const T* gate, const T* weight,
                              const T* rstd, int64_t rows, int64_t d, T* dx, T* dgate,
                              compute_t<T>* dweight_part, int64_t groups) {
  const int64_t blocks = kWarp ? (groups + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock : groups;
  HAM_CHECK(blocks < (int64_t(1) << 31), "rms_norm backward: ", blocks, " blocks exceed the grid");
  HAM_LAUNCH(unsigned(blocks), kThreads, 0, launch_stream(),
             rms_norm_backward_kernel<kWarp, N, kPacks, T>)(dy, x, gate, weight, rstd, rows, d,
                                                            groups, dx, dgate, dweight_part);
  HAM_CUDA_CHECK_LAUNCH();
}

// dweight_j = sum over groups g of part[g][j], in group order.
template <class T>
struct PartialSum {
  const compute_t<T>* part;
  int64_t d;
  __device__ compute_t<T> operator()(int64_t, int64_t g, int64_t j) const {
    return part[g * d + j];
  }
};

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                       const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dgate,
                       Tensor& dweight) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  use_device_of(x);
  dispatch_floating("rms_norm backward", x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const T *dyp = ptr<const T>(dy), *xp = ptr<const T>(x), *gp = ptr_or_null<const T>(gate),
            *wp = ptr_or_null<const T>(weight);
    T *dxp = ptr_or_null<T>(dx), *dgp = ptr_or_null<T>(dgate);
    // dweight by a second pass over x and dy (rows too short or too long for the fused one)
    auto dweight_second_pass = [&] {
      reduce_middle<C>(x.device(), 1, rows, d,
                       WeightGradTerm<T>{dyp, xp, gp, ptr<const T>(rstd), d},
                       StoreScaled<T, C>{ptr<T>(dweight), C(1)});
    };
    if (rows == 0 || d == 0) {  // dweight: sums over no rows
      if (dweight.defined()) dweight_second_pass();
      return;
    }
    const bool warp = d <= kWarpRowMax;
    const int64_t size = warp ? 32 : kThreads;
    auto run = [&]<int N>() {
      // dweight in the same pass when a thread's packs fit its registers (32 values)
      constexpr int kPacks = 32 / N;
      const bool fused =
          dweight.defined() && d >= kFusedMinLength && (d / N + size - 1) / size <= kPacks;
      const int64_t groups =
          fused ? std::min(rows, warp ? kBackwardWarpGroups : kBackwardBlockGroups) : rows;
      Tensor part;
      if (fused) part = Tensor::empty(Shape{groups * d}, compute_dtype<T>(), x.device());
      if (fused || dx.defined() || dgate.defined()) {
        C* partp = fused ? ptr<C>(part) : nullptr;
        if (warp && fused) {
          launch_rms_norm_backward<true, N, kPacks>(dyp, xp, gp, wp, ptr<const T>(rstd), rows, d,
                                                    dxp, dgp, partp, groups);
        } else if (warp) {
          launch_rms_norm_backward<true, N, 0>(dyp, xp, gp, wp, ptr<const T>(rstd), rows, d, dxp,
                                               dgp, partp, groups);
        } else if (fused) {
          launch_rms_norm_backward<false, N, kPacks>(dyp, xp, gp, wp, ptr<const T>(rstd), rows,
                                                     d, dxp, dgp, partp, groups);
        } else {
          launch_rms_norm_backward<false, N, 0>(dyp, xp, gp, wp, ptr<const T>(rstd), rows, d,
                                                dxp, dgp, partp, groups);
        }
      }
      if (fused) {
        reduce_middle<C>(x.device(), 1, groups, d, PartialSum<T>{ptr<const C>(part), d},
                         StoreScaled<T, C>{ptr<T>(dweight), C(1)});
      } else if (dweight.defined()) {
        dweight_second_pass();
      }
    };
    if (rows_packable<T>(d, {dyp, xp, gp, wp, dxp, dgp})) {
      run.template operator()<kPackWidth<T>>();
    } else {
      run.template operator()<1>();
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
