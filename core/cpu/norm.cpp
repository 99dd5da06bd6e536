#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cpu/parallel.h"
#include "core/ops/norm.h"
#include "core/ops/unary.h"

namespace ham::cpu {

namespace {

// dweight columns summed together, so each row read is contiguous.
constexpr int64_t kColumnBlock = 64;

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
    parallel_for(rows, d, [&](int64_t row) {
      const T* xr = px + row * d;
      double sum_sq = 0;
      for (int64_t j = 0; j < d; ++j) sum_sq += double(xr[j]) * double(xr[j]);
      // The backward reads rstd back in T, so the forward uses that same rounded value.
      const T r = T(1.0 / std::sqrt(sum_sq / double(d) + eps));
      pr[row] = r;
      T* yr = py + row * d;
      for (int64_t j = 0; j < d; ++j) {
        T n = xr[j] * r;
        if (pw) n *= pw[j];
        if (pg) {
          T z = pg[row * d + j];
          n *= z * sigmoid_scalar(z);
        }
        yr[j] = n;
      }
    });
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                       const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dgate,
                       Tensor& dweight) {
  dispatch_floating("rms_norm backward", x.dtype(), [&]<class T>() {
    const int64_t d = x.size(-1), rows = rstd.numel();
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* pg = gate.defined() ? gate.data<T>() : nullptr;
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;
    const T* pr = rstd.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    T* pdg = dgate.defined() ? dgate.data<T>() : nullptr;

    if (pdx || pdg) {
      parallel_for(rows, d, [&](int64_t row) {
        const int64_t base = row * d;
        const T r = pr[row];
        double dot = 0;  // sum_j g_j xhat_j
        for (int64_t j = 0; j < d; ++j) {
          const T xhat = px[base + j] * r;
          const T w = pw ? pw[j] : T(1);
          T g = pdy[base + j] * w;  // becomes dy silu(gate) w
          if (pg) {
            const T z = pg[base + j], s = sigmoid_scalar(z);
            if (pdg) pdg[base + j] = pdy[base + j] * xhat * w * s * (T(1) + z * (T(1) - s));
            g *= z * s;
          }
          if (pdx) pdx[base + j] = g;  // held here until the mean is known
          dot += double(g) * double(xhat);
        }
        if (!pdx) return;
        const T mean_g_xhat = T(dot / double(d));
        for (int64_t j = 0; j < d; ++j) {
          const T xhat = px[base + j] * r;
          pdx[base + j] = r * (pdx[base + j] - xhat * mean_g_xhat);
        }
      });
    }

    if (dweight.defined()) {
      // dweight_j = sum_rows dy silu(gate) xhat, rows in order per column block.
      T* pdw = dweight.data<T>();
      const int64_t blocks = (d + kColumnBlock - 1) / kColumnBlock;
      parallel_for(blocks, rows * kColumnBlock, [&](int64_t b) {
        const int64_t begin = b * kColumnBlock, width = std::min(kColumnBlock, d - begin);
        double acc[kColumnBlock] = {};
        for (int64_t row = 0; row < rows; ++row) {
          const T r = pr[row];
          const int64_t base = row * d + begin;
          for (int64_t j = 0; j < width; ++j) {
            T dn = pdy[base + j];
            if (pg) {
              const T z = pg[base + j];
              dn *= z * sigmoid_scalar(z);
            }
            acc[j] += double(dn) * double(px[base + j] * r);
          }
        }
        for (int64_t j = 0; j < width; ++j) pdw[begin + j] = T(acc[j]);
      });
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
      double sum_sq = 0;
      for (int64_t j = 0; j < d; ++j) sum_sq += double(xr[j]) * double(xr[j]);
      const T r = T(1.0 / std::sqrt(sum_sq + eps));
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
      double dot = 0;  // sum_j dy_j x_j
      for (int64_t j = 0; j < d; ++j) dot += double(pdy[base + j]) * double(px[base + j]);
      const T r = pr[row];
      const T c = T(double(r) * double(r) * dot);
      for (int64_t j = 0; j < d; ++j) pdx[base + j] = r * (pdy[base + j] - px[base + j] * c);
    });
  });
}

}  // namespace ham::cpu
