#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
#include "core/cpu/parallel.h"
#include "core/ops/norm.h"

namespace ham::cpu {

namespace {

// Rows per task of the backward, fixed so that dweight's partial sums (one per task, added
// in task order) do not depend on the thread count.
constexpr int64_t kRowsPerTask = 64;
// Rows of the forward whose 1 / rms are computed together.
constexpr int64_t kRowsPerBlock = 16;

// sum_j a_j b_j in f64: blocks of 4 f64 packets, converted from T on the stack (the
// compiler vectorizes the conversion), summed into 4 independent accumulators, the tail
// zero-padded. The earlier 4-lane loop compiled to two chains of 2-lane FMAs, and
// rms_norm waited on their latency (59% of its time at d = 128, by perf).
template <class T>
double dot_in_f64(const T* a, const T* b, int64_t n) {
  using P = Packet<double>;
  constexpr int64_t kLanes = kPacketSize<double>, kBlock = 4 * kLanes;
  // Named accumulators: in an array, gcc kept them on the stack, and each FMA waited on
  // the last one's store.
  P acc0 = pk::pset1<P>(0.0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  alignas(64) double xa[kBlock], xb[kBlock];
  auto accumulate = [&] {
    acc0 = pk::pmadd(pk::pload<P>(xa), pk::pload<P>(xb), acc0);
    acc1 = pk::pmadd(pk::pload<P>(xa + kLanes), pk::pload<P>(xb + kLanes), acc1);
    acc2 = pk::pmadd(pk::pload<P>(xa + 2 * kLanes), pk::pload<P>(xb + 2 * kLanes), acc2);
    acc3 = pk::pmadd(pk::pload<P>(xa + 3 * kLanes), pk::pload<P>(xb + 3 * kLanes), acc3);
  };
  int64_t j = 0;
  for (; j + kBlock <= n; j += kBlock) {
    for (int64_t i = 0; i < kBlock; ++i) {
      xa[i] = double(a[j + i]);
      xb[i] = double(b[j + i]);
    }
    accumulate();
  }
  if (j < n) {  // the tail, zero-padded
    std::fill(xa, xa + kBlock, 0.0);
    std::fill(xb, xb + kBlock, 0.0);
    for (int64_t i = 0; i < n - j; ++i) {
      xa[i] = double(a[j + i]);
      xb[i] = double(b[j + i]);
    }
    accumulate();
  }
  // The lanes summed from memory: Eigen's predux on an AVX-512 double packet sets off
  // GCC 12's -Wuninitialized (in _mm512_extractf64x4_pd).
  pk::pstore(xa, pk::padd(pk::padd(acc0, acc2), pk::padd(acc1, acc3)));
  double sum = 0;
  for (int64_t lane = 0; lane < kLanes; ++lane) sum += xa[lane];
  return sum;
}

// silu(z_j) for j < n, on packets.
template <class T>
void silu_row(const T* z, T* silu, int64_t n) {
  for_each_packet_serial<T>(n, [&](int64_t j, int64_t count) {
    const Packet<T> zj = load_padded(z + j, count);
    store_partial(silu + j, scaled_sigmoid_packet(zj, zj), count);
  });
}

// silu(z_j) and silu'(z_j) = s (1 + z (1 - s)), s = sigmoid(z_j), for j < n, on packets.
template <class T>
void silu_and_derivative_row(const T* z, T* silu, T* derivative, int64_t n) {
  for_each_packet_serial<T>(n, [&](int64_t j, int64_t count) {
    const Packet<T> zj = load_padded(z + j, count);
    Packet<T> s, complement;
    sigmoid_and_complement(zj, s, complement);
    store_partial(silu + j, pk::pmul(zj, s), count);
    store_partial(derivative + j, pk::pmul(s, pk::pmadd(zj, complement, packet_ones<Packet<T>>())),
                  count);
  });
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight, double eps, Tensor& y,
              Tensor& rstd) {
  dispatch_floating("rms_norm", x.dtype(), [&]<class T>() {
    const int64_t d = x.size(-1), rows = rstd.numel();
    const T* px = x.data<T>();
    const T* pg = gate.defined() ? gate.data<T>() : nullptr;
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;
    T* py = y.data<T>();
    T* pr = rstd.data<T>();
    // A block's 1 / rms first, then its rows: the rows' dot products, square roots and
    // divisions overlap, where one row at a time waited on each in turn.
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    parallel_for(blocks, kRowsPerBlock * d * (pg ? 4 : 1), [&](int64_t block) {
      const int64_t first = block * kRowsPerBlock, last = std::min(rows, first + kRowsPerBlock);
      for (int64_t row = first; row < last; ++row) {
        const T* xr = px + row * d;
        // The backward reads rstd back in T, so the forward uses that same rounded value.
        pr[row] = T(1.0 / std::sqrt(dot_in_f64(xr, xr, d) / double(d) + eps));
      }
      for (int64_t row = first; row < last; ++row) {
        const T* xr = px + row * d;
        const T r = pr[row];
        T* yr = py + row * d;
        if (pg) {
          silu_row(pg + row * d, yr, d);  // y holds silu(gate) until the product below
          if (pw) {
            for (int64_t j = 0; j < d; ++j) yr[j] *= xr[j] * r * pw[j];
          } else {
            for (int64_t j = 0; j < d; ++j) yr[j] *= xr[j] * r;
          }
        } else if (pw) {
          for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * r * pw[j];
        } else {
          for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * r;
        }
      }
    });
  });
}

// Per task of kRowsPerTask rows: silu and silu' of the gate rows on packets, then plain
// loops the compiler vectorizes, with a missing weight or gate read as ones. dweight sums
// each task's rows into its own f64 partial, and the partials in task order.
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                       const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dgate,
                       Tensor& dweight) {
  dispatch_floating("rms_norm backward", x.dtype(), [&]<class T>() {
    const int64_t d = x.size(-1), rows = rstd.numel();
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* pg = gate.defined() ? gate.data<T>() : nullptr;
    const T* pr = rstd.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    T* pdg = dgate.defined() ? dgate.data<T>() : nullptr;
    const bool want_dweight = dweight.defined();
    const std::vector<T> ones(size_t(d), T(1));
    const T* pw = weight.defined() ? weight.data<T>() : ones.data();

    const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
    std::vector<double> dweight_partials(want_dweight ? size_t(tasks * d) : 0);
    parallel_for(tasks, kRowsPerTask * d * 4, [&](int64_t task) {
      const size_t width = size_t(d);
      std::vector<T> xhat(width), silu(width, T(1)), derivative(width);
      std::vector<T> g(width);  // dy silu(gate) weight
      double* partial = want_dweight ? dweight_partials.data() + task * d : nullptr;
      const int64_t end = std::min(rows, (task + 1) * kRowsPerTask);
      for (int64_t row = task * kRowsPerTask; row < end; ++row) {
        const int64_t base = row * d;
        const T r = pr[row];
        const T* dyr = pdy + base;
        const T* xr = px + base;
        if (pg) silu_and_derivative_row(pg + base, silu.data(), derivative.data(), d);
        for (int64_t j = 0; j < d; ++j) {
          xhat[size_t(j)] = xr[j] * r;
          g[size_t(j)] = dyr[j] * silu[size_t(j)] * pw[j];
        }
        if (partial) {
          for (int64_t j = 0; j < d; ++j) {
            partial[j] += double(dyr[j] * silu[size_t(j)]) * double(xhat[size_t(j)]);
          }
        }
        if (pdg) {  // dy n silu'(gate), n = xhat weight
          for (int64_t j = 0; j < d; ++j) {
            pdg[base + j] = dyr[j] * xhat[size_t(j)] * pw[j] * derivative[size_t(j)];
          }
        }
        if (pdx) {
          const T mean_g_xhat = T(dot_in_f64(g.data(), xhat.data(), d) / double(d));
          for (int64_t j = 0; j < d; ++j) {
            pdx[base + j] = r * (g[size_t(j)] - xhat[size_t(j)] * mean_g_xhat);
          }
        }
      }
    });
    if (want_dweight) {
      // Task 0's partials += each later task's, in task order, a contiguous row at a time.
      double* sums = dweight_partials.data();
      for (int64_t task = 1; task < tasks; ++task) {
        const double* later = sums + task * d;
        for (int64_t j = 0; j < d; ++j) sums[j] += later[j];
      }
      T* pdw = dweight.data<T>();
      for (int64_t j = 0; j < d; ++j) pdw[j] = T(sums[j]);
    }
  });
}

void l2_norm(const Tensor& x, double eps, Tensor& y, Tensor& rstd) {
  dispatch_floating("l2_norm", x.dtype(), [&]<class T>() {
    const int64_t d = x.size(-1), rows = rstd.numel();
    const T* px = x.data<T>();
    T* py = y.data<T>();
    T* pr = rstd.data<T>();
    parallel_for(rows, d, [&](int64_t row) {
      const T* xr = px + row * d;
      const T r = T(1.0 / std::sqrt(dot_in_f64(xr, xr, d) + eps));
      pr[row] = r;
      T* yr = py + row * d;
      for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * r;
    });
  });
}

void l2_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dx) {
  dispatch_floating("l2_norm backward", x.dtype(), [&]<class T>() {
    const int64_t d = x.size(-1), rows = rstd.numel();
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(rows, d, [&](int64_t row) {
      const int64_t base = row * d;
      const double dot = dot_in_f64(pdy + base, px + base, d);  // sum_j dy_j x_j
      const T r = pr[row];
      const T c = T(double(r) * double(r) * dot);
      for (int64_t j = 0; j < d; ++j) pdx[base + j] = r * (pdy[base + j] - px[base + j] * c);
    });
  });
}

}  // namespace ham::cpu
