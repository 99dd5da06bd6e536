// CUDA kernels of core/ops/norm.h, rows of the last dim D (x viewed as [rows, D]):
// rms_norm (weight and gate optional):
//   rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x rstd,  n = xhat weight,  y = n silu(gate)
// backward, g = dy silu(gate) weight:
//   dx = rstd (g - xhat mean(g xhat)),   dgate = dy n silu'(gate),   dweight = sum_rows dy silu(gate) xhat
// l2_norm:  rstd = 1 / sqrt(sum(x^2) + eps),  y = x rstd,  dx = rstd (dy - x rstd^2 sum(dy x))
// One warp per row up to D = 1024, one block per row beyond; sums in f32 (f64 for f64).
// rms_norm moves 16-byte packs where D and the pointers allow; its packed rows of 256 to
// 8192 elements go to row groups that keep a row in registers (rms_norm_rows_kernel).
// rstd is stored in x's dtype and, as on the CPU, the forward uses that rounded value so
// the backward sees the same xhat. With dweight wanted, the backward's row groups keep a
// row's x and dy in registers from the first pass to dx's, with the next row's loads in
// flight, and dweight's partial sums in registers (rows 256 to 8192 long: 4096 in f64,
// 2048 when rows do not move as packs); cuda/reduce_utils.cuh adds the groups' sums in
// order: deterministic. A thread's registers hold exactly the packs of a row it needs.
// (Sized for the longest row, the d = 2048 bf16 kernel took 96 registers by ptxas: 2
// blocks of 256 threads per SM, so its 512 row groups ran in two waves.)
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>

#include "core/ops/norm.h"
#include "cuda/launch.h"
#include "cuda/norm.h"
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
__device__ __forceinline__ void rms_norm_row(const T* x, const T* gate, const T* weight,
                                             int64_t rows, int64_t d, compute_t<T> eps, T* y,
                                             T* rstd) {
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

// A warp per row.
template <int N, class T>
__global__ void rms_norm_warp_kernel(const T* x, const T* gate, const T* weight, int64_t rows,
                                     int64_t d, compute_t<T> eps, T* y, T* rstd) {
  rms_norm_row<true, N>(x, gate, weight, rows, d, eps, y, rstd);
}

// A block per row.
template <int N, class T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_block_kernel(const T* x, const T* gate, const T* weight, int64_t rows, int64_t d,
                          compute_t<T> eps, T* y, T* rstd) {
  rms_norm_row<false, N>(x, gate, weight, rows, d, eps, y, rstd);
}

// Row groups for rows of 256 to 8192 packed elements. Group g (a warp or a block) takes
// rows g, g + groups, ...; a thread keeps its packs lane + k size (k < kPacks) of a row's
// x (and gate) in registers from the sum of squares to the output, the weight's for the
// whole group, and with kPacks <= 2 loads the next row's packs before reducing this one,
// so that a row's loads are in flight during the previous row's reduction and stores.
// (A block per row held one bf16 pack a thread at d = 2048: its only loads in flight
// between reductions, and it moved 62-68% of copy bandwidth on the H200. These groups
// moved 92% there, 84% at d = 4096, and 89% in f32.)
template <bool kWarp, int N, int kPacks, bool kGated, class T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_rows_kernel(const T* x, const T* gate, const T* weight, int64_t rows, int64_t d,
                         int64_t groups, compute_t<T> eps, T* y, T* rstd) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  constexpr bool kPrefetch = kPacks <= 2;
  const int64_t group = row_index<kWarp>();
  if (group >= groups) return;  // whole warps (kWarp) or whole blocks
  const int64_t packs = d / N;
  auto pack_of = [&](int k) { return Group::lane() + int64_t(k) * Group::size(); };
  struct RowPacks {
    P x[kPacks], z[kGated ? kPacks : 1];
  };
  auto load_row = [&](int64_t row, RowPacks& into) {
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    const P* zr = reinterpret_cast<const P*>(kGated ? gate + row * d : nullptr);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (pack_of(k) < packs) {
        into.x[k] = xr[pack_of(k)];
        if constexpr (kGated) into.z[k] = zr[pack_of(k)];
      }
    }
  };
  P w[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    w[k] = weight && pack_of(k) < packs ? reinterpret_cast<const P*>(weight)[pack_of(k)] : P{};
  }
  RowPacks now, next;
  load_row(group, now);  // group < groups <= rows
  for (int64_t row = group; row < rows; row += groups) {
    const bool more = row + groups < rows;
    if (kPrefetch && more) load_row(row + groups, next);
    C sum_sq = C(0);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (pack_of(k) >= packs) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const C v = load(now.x[k].v[e]);
        sum_sq += v * v;
      }
    }
    sum_sq = Group::sum(sum_sq);
    const T r_stored = store<T>(rsqrt_(sum_sq / C(d) + eps));
    const C r = load(r_stored);
    if (Group::lane() == 0) rstd[row] = r_stored;
    P* yr = reinterpret_cast<P*>(y + row * d);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (pack_of(k) >= packs) continue;
      P out;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C n = load(now.x[k].v[e]) * r;
        if (weight) n *= load(w[k].v[e]);
        if constexpr (kGated) {
          const C z = load(now.z[k].v[e]);
          n *= z * sigmoid(z);
        }
        out.v[e] = store<T>(n);
      }
      yr[pack_of(k)] = out;
    }
    if (!more) break;
    if constexpr (kPrefetch) now = next;
    else load_row(row + groups, now);
  }
}

// One element's backward terms from dy, xhat, the weight w (1 without) and, when gated,
// the gate z: dn = dy silu(z), g = dn w (the dx and dot term), dgate = dy xhat w silu'(z).
template <class C>
struct ElementGrad {
  C g, dn, dgate;
};
template <class C>
__device__ __forceinline__ ElementGrad<C> element_grad(C dy, C xhat, C w, bool gated, C z) {
  ElementGrad<C> t{dy * w, dy, C(0)};
  if (gated) {
    const C s = sigmoid(z);
    t.dgate = dy * xhat * w * s * (C(1) + z * (C(1) - s));
    t.g *= z * s;
    t.dn *= z * s;
  }
  return t;
}

// dx and dgate rows (either may be null), one row per group (a warp or a block): the
// backward without dweight, and with it for rows too short or too long for the fused
// kernel below (dweight then takes a second pass).
template <bool kWarp, int N, class T>
__global__ void rms_norm_backward_kernel(const T* dy, const T* x, const T* gate, const T* weight,
                                         const T* rstd, int64_t rows, int64_t d, T* dx,
                                         T* dgate) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  const int64_t row = row_index<kWarp>();
  if (row >= rows) return;  // whole warps (kWarp) or whole blocks
  const int64_t packs = d / N, base = row * d;
  const P* wr = reinterpret_cast<const P*>(weight);
  const P* xr = reinterpret_cast<const P*>(x + base);
  const P* dyr = reinterpret_cast<const P*>(dy + base);
  const P* gr = reinterpret_cast<const P*>(gate ? gate + base : nullptr);
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
      const ElementGrad<C> t = element_grad(C(load(dyp.v[e])), xhat,
                                            weight ? C(load(wp.v[e])) : C(1), gate != nullptr,
                                            gate ? C(load(gp.v[e])) : C(0));
      if (gate) dgp.v[e] = store<T>(t.dgate);
      dot += t.g * xhat;
    }
    if (gate && dgate) reinterpret_cast<P*>(dgate + base)[p] = dgp;
  }
  if (!dx) return;  // the same in the whole group
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
      const C g = element_grad(C(load(dyp.v[e])), xhat, weight ? C(load(wp.v[e])) : C(1),
                               gate != nullptr, gate ? C(load(gp.v[e])) : C(0)).g;
      out.v[e] = store<T>(r * (g - xhat * mean_g_xhat));
    }
    dxr[p] = out;
  }
}

// Blocks of the fused backward that must fit an SM at once: with one pack per thread, 4,
// so that all 512 row groups fit a 132-SM H200 at once (ptxas: 60 registers for the bf16
// kernel, 64 with a gate and 72 bytes spilled, which unbounded took 80: 3 blocks per SM,
// two waves); with more packs, what the registers allow.
template <int kPacks>
constexpr int kFusedMinBlocks = kPacks == 1 ? 4 : 1;

// dx and dgate rows (either may be null) and this group's share of dweight. Group g (a
// warp or a block) takes rows g, g + groups, ...; thread packs k < kPacks of a row are
// packs lane + k size (the row must fit: packs <= kPacks * size). The thread keeps its
// packs of x and dy in registers from the first pass (dot, dgate, dweight's terms) to the
// dx pass, and the weight's for the whole group; with kPacks <= 2 it also loads the next
// row's packs before working on this one, so that a row's loads are in flight during the
// previous row's reduction and stores. dweight's partial sums stay in registers and go to
// dweight_part[g][:] at the end; rms_norm_backward adds the groups in order (PartialSum).
template <bool kWarp, int N, int kPacks, bool kGated, class T>
__global__ void __launch_bounds__(kThreads, kFusedMinBlocks<kPacks>)
    rms_norm_backward_fused_kernel(const T* dy, const T* x, const T* gate, const T* weight,
                                   const T* rstd, int64_t rows, int64_t d, int64_t groups,
                                   T* dx, T* dgate, compute_t<T>* dweight_part) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  constexpr bool kPrefetch = kPacks <= 2;
  const int64_t group = row_index<kWarp>();
  if (group >= groups) return;  // whole warps (kWarp) or whole blocks
  const int64_t packs = d / N;
  auto pack_of = [&](int k) { return Group::lane() + int64_t(k) * Group::size(); };
  struct RowPacks {
    P x[kPacks], dy[kPacks];
    C r;
  };
  auto load_row = [&](int64_t row, RowPacks& into) {
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    const P* dyr = reinterpret_cast<const P*>(dy + row * d);
    into.r = load(rstd[row]);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (pack_of(k) < packs) {
        into.x[k] = xr[pack_of(k)];
        into.dy[k] = dyr[pack_of(k)];
      }
    }
  };
  P w[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    w[k] = weight && pack_of(k) < packs ? reinterpret_cast<const P*>(weight)[pack_of(k)] : P{};
  }
  C part[kPacks][N] = {};
  RowPacks now, next;
  load_row(group, now);  // group < groups <= rows
  for (int64_t row = group; row < rows; row += groups) {
    const bool more = row + groups < rows;
    if (kPrefetch && more) load_row(row + groups, next);
    const int64_t base = row * d;
    const P* gr = reinterpret_cast<const P*>(kGated ? gate + base : nullptr);
    const C r = now.r;
    C dot = C(0);  // sum_j g_j xhat_j
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = pack_of(k);
      if (p >= packs) continue;
      const P gp = kGated ? gr[p] : P{};
      P dgp;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const C xhat = load(now.x[k].v[e]) * r;
        const ElementGrad<C> t =
            element_grad(C(load(now.dy[k].v[e])), xhat, weight ? C(load(w[k].v[e])) : C(1),
                         kGated, kGated ? C(load(gp.v[e])) : C(0));
        if constexpr (kGated) dgp.v[e] = store<T>(t.dgate);
        dot += t.g * xhat;
        part[k][e] += t.dn * xhat;
      }
      if constexpr (kGated) {
        if (dgate) reinterpret_cast<P*>(dgate + base)[p] = dgp;
      }
    }
    if (dx) {  // the same in the whole group
      const C mean_g_xhat = Group::sum(dot) / C(d);
      P* dxr = reinterpret_cast<P*>(dx + base);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t p = pack_of(k);
        if (p >= packs) continue;
        const P gp = kGated ? gr[p] : P{};
        P out;
#pragma unroll
        for (int e = 0; e < N; ++e) {
          const C xhat = load(now.x[k].v[e]) * r;
          const C g = element_grad(C(load(now.dy[k].v[e])), xhat,
                                   weight ? C(load(w[k].v[e])) : C(1), kGated,
                                   kGated ? C(load(gp.v[e])) : C(0)).g;
          out.v[e] = store<T>(r * (g - xhat * mean_g_xhat));
        }
        dxr[p] = out;
      }
    }
    if (!more) break;
    if constexpr (kPrefetch) now = next;
    else load_row(row + groups, now);
  }
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = pack_of(k);
    if (p >= packs) continue;
#pragma unroll
    for (int e = 0; e < N; ++e) dweight_part[group * d + p * N + e] = part[k][e];
  }
}

// value(0, row, j) = dy silu(gate) xhat, summed over rows for dweight_j.
template <class T>
struct WeightGradTerm {
  const T *dy, *x, *gate, *rstd;
  int64_t d;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t j) const {
    using C = compute_t<T>;
    const int64_t at = row * d + j;
    const C xhat = load(x[at]) * C(load(rstd[row]));
    return element_grad(C(load(dy[at])), xhat, C(1), gate != nullptr,
                        gate ? C(load(gate[at])) : C(0)).dn * xhat;
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

// Row groups of the fused backward, each taking every groups-th row: at most 2048 warps
// (rows up to kWarpRowMax) or 512 blocks, fewer where a thread holds more packs of a row
// and its registers leave fewer blocks per SM (ptxas: 60 registers with one bf16 pack, 111
// with two, 175 with four), so that every group fits a 132-SM H100/H200 at once (a second
// wave doubled the time). The counts depend only on the row length and dtype, so dweight's
// sums are the same on every device and run. Rows shorter than kFusedMinLength keep one
// warp per row and the second pass: with fewer warps than rows, too few loads would be in
// flight for them.
constexpr int64_t kFusedMinLength = 256;

int64_t fused_groups(bool warp, int64_t packs_per_thread, int64_t rows) {
  int64_t most = 0;
  if (warp) most = packs_per_thread <= 2 ? 2048 : 1024;
  else most = packs_per_thread <= 1 ? 512 : packs_per_thread <= 2 ? 256 : 128;
  return std::min(rows, most);
}

// Largest number of packs a thread of the fused backward keeps per row: 8, or fewer so that
// they hold at most 32 values (kPacks takes the powers of two up to it).
template <int N>
constexpr int kMaxFusedPacks = 32 / N < 8 ? 32 / N : 8;

// Fewest packs a thread of a row group keeps, as kPacks gives them (a power of two): a
// warp's rows are at least kFusedMinLength long, a block's longer than kWarpRowMax. The
// launchers' kPacks start here: no row length reaches a kernel below it, and starting at 1
// compiled 60 such kernels of the 136 (every dtype), for nvcc and the emulator alike.
template <bool kWarp, int N>
constexpr int kFewestPacks = int(std::bit_ceil(uint64_t(
    ((kWarp ? kFusedMinLength : kWarpRowMax + 1) + N * (kWarp ? 32 : kThreads) - 1) /
    (N * (kWarp ? 32 : kThreads)))));

// Blocks of kThreads for `groups` row groups of warps (kWarp) or blocks.
template <bool kWarp>
unsigned row_group_blocks(int64_t groups) {
  const int64_t blocks = kWarp ? (groups + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock : groups;
  HAM_CHECK(blocks < (int64_t(1) << 31), "rms_norm: ", blocks, " blocks exceed the grid");
  return unsigned(blocks);
}

// Launches rms_norm_backward_fused_kernel with the fewest packs per thread (a power of two)
// that hold a row: packs_per_thread <= kMaxFusedPacks<N>.
template <bool kWarp, int N, class T, int kPacks = kFewestPacks<kWarp, N>>
void launch_rms_norm_backward_fused(int64_t packs_per_thread, const T* dy, const T* x,
                                    const T* gate, const T* weight, const T* rstd, int64_t rows,
                                    int64_t d, T* dx, T* dgate, compute_t<T>* dweight_part,
                                    int64_t groups) {
  if constexpr (kPacks < kMaxFusedPacks<N>) {
    if (packs_per_thread > kPacks) {
      launch_rms_norm_backward_fused<kWarp, N, T, 2 * kPacks>(
          packs_per_thread, dy, x, gate, weight, rstd, rows, d, dx, dgate, dweight_part, groups);
      return;
    }
  }
  HAM_CHECK(packs_per_thread <= kPacks, "rms_norm backward: ", packs_per_thread,
            " packs per thread exceed the fused kernel's ", kPacks);
  auto launch = [&]<bool kGated>() {
    HAM_LAUNCH(row_group_blocks<kWarp>(groups), kThreads, 0, launch_stream(),
               rms_norm_backward_fused_kernel<kWarp, N, kPacks, kGated, T>)(
        dy, x, gate, weight, rstd, rows, d, groups, dx, dgate, dweight_part);
    HAM_CUDA_CHECK_LAUNCH();
  };
  if (gate) launch.template operator()<true>();
  else launch.template operator()<false>();
}

std::atomic<int64_t> g_row_groups{0};  // set_rms_norm_row_groups

// Launches rms_norm_rows_kernel with the fewest packs per thread (a power of two) that hold
// a row, as many row groups as fit the GPU at once (each row is independent: the count
// changes no value).
template <bool kWarp, int N, class T, int kPacks = kFewestPacks<kWarp, N>>
void launch_rms_norm_rows(int64_t packs_per_thread, const T* x, const T* gate, const T* weight,
                          int64_t rows, int64_t d, compute_t<T> eps, T* y, T* rstd) {
  if constexpr (kPacks < kMaxFusedPacks<N>) {
    if (packs_per_thread > kPacks) {
      launch_rms_norm_rows<kWarp, N, T, 2 * kPacks>(packs_per_thread, x, gate, weight, rows, d,
                                                    eps, y, rstd);
      return;
    }
  }
  HAM_CHECK(packs_per_thread <= kPacks, "rms_norm: ", packs_per_thread,
            " packs per thread exceed the row-group kernel's ", kPacks);
  auto launch = [&]<bool kGated>() {
    auto* kernel = &rms_norm_rows_kernel<kWarp, N, kPacks, kGated, T>;
    const int per_sm = resident_blocks_per_sm("rms_norm", kernel, kThreads, 0);
    const int64_t resident = int64_t(std::max(1, per_sm)) * multiprocessor_count() *
                             (kWarp ? kWarpRowsPerBlock : 1);
    const int64_t most = g_row_groups.load();
    const int64_t groups = std::min(rows, most > 0 ? std::min(most, resident) : resident);
    HAM_LAUNCH(row_group_blocks<kWarp>(groups), kThreads, 0, launch_stream(), kernel)(
        x, gate, weight, rows, d, groups, eps, y, rstd);
    HAM_CUDA_CHECK_LAUNCH();
  };
  if (gate) launch.template operator()<true>();
  else launch.template operator()<false>();
}

void rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight, double eps, Tensor& y,
              Tensor& rstd) {
  const int64_t d = x.size(-1), rows = rstd.numel();
  if (rows == 0 || d == 0) return;
  use_device_of(x);
  dispatch_floating("rms_norm", x.dtype(), [&]<class T>() {
    const T *xp = ptr<const T>(x), *gp = ptr_or_null<const T>(gate),
            *wp = ptr_or_null<const T>(weight);
    T *yp = ptr<T>(y), *rp = ptr<T>(rstd);
    const compute_t<T> e(eps);
    if (!rows_packable<T>(d, {xp, gp, wp, yp})) {
      launch_rows(rows, d, &rms_norm_warp_kernel<1, T>, &rms_norm_block_kernel<1, T>, xp, gp,
                  wp, rows, d, e, yp, rp);
      return;
    }
    constexpr int N = kPackWidth<T>;
    const bool warp = d <= kWarpRowMax;
    const int64_t size = warp ? 32 : kThreads;
    const int64_t packs_per_thread = (d / N + size - 1) / size;
    if (d >= kFusedMinLength && packs_per_thread <= kMaxFusedPacks<N>) {
      if (warp) launch_rms_norm_rows<true, N>(packs_per_thread, xp, gp, wp, rows, d, e, yp, rp);
      else launch_rms_norm_rows<false, N>(packs_per_thread, xp, gp, wp, rows, d, e, yp, rp);
      return;
    }
    launch_rows(rows, d, &rms_norm_warp_kernel<N, T>, &rms_norm_block_kernel<N, T>, xp, gp, wp,
                rows, d, e, yp, rp);
  });
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
      reduce_middle<C, ReduceForms::Columns>(x.device(), 1, rows, d,
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
      // dweight in the same pass when a thread's packs fit its registers
      const int64_t packs_per_thread = (d / N + size - 1) / size;
      const bool fused = dweight.defined() && d >= kFusedMinLength &&
                         packs_per_thread <= kMaxFusedPacks<N>;
      const T* rp = ptr<const T>(rstd);
      if (fused) {
        const int64_t groups = fused_groups(warp, packs_per_thread, rows);
        Tensor part = Tensor::empty(Shape{groups * d}, compute_dtype<T>(), x.device());
        if (warp) {
          launch_rms_norm_backward_fused<true, N>(packs_per_thread, dyp, xp, gp, wp, rp, rows, d,
                                                  dxp, dgp, ptr<C>(part), groups);
        } else {
          launch_rms_norm_backward_fused<false, N>(packs_per_thread, dyp, xp, gp, wp, rp, rows,
                                                   d, dxp, dgp, ptr<C>(part), groups);
        }
        reduce_middle<C, ReduceForms::Columns>(x.device(), 1, groups, d,
                                               PartialSum<T>{ptr<const C>(part), d},
                                               StoreScaled<T, C>{ptr<T>(dweight), C(1)});
        return;
      }
      if (dx.defined() || dgate.defined()) {
        if (warp) {
          HAM_LAUNCH(row_group_blocks<true>(rows), kThreads, 0, launch_stream(),
                     rms_norm_backward_kernel<true, N, T>)(dyp, xp, gp, wp, rp, rows, d, dxp, dgp);
        } else {
          HAM_LAUNCH(row_group_blocks<false>(rows), kThreads, 0, launch_stream(),
                     rms_norm_backward_kernel<false, N, T>)(dyp, xp, gp, wp, rp, rows, d, dxp, dgp);
        }
        HAM_CUDA_CHECK_LAUNCH();
      }
      if (dweight.defined()) dweight_second_pass();
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

int64_t set_rms_norm_row_groups(int64_t most) {
  HAM_CHECK(most >= 0, "set_rms_norm_row_groups: ", most, " row groups (0: as many as fit)");
  return g_row_groups.exchange(most);
}

}  // namespace ham::cuda
