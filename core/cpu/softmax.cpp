#include <cmath>
#include <cstdint>
#include <limits>

#include "core/cpu/parallel.h"
#include "core/ops/softmax.h"

namespace ham::cpu {

namespace {

// Rows of the last dim; sums accumulate in double so long f32 rows (a vocabulary) keep
// their precision.
template <bool kLog>
void forward_rows(const char* op, const Tensor& x, Tensor& y) {
  if (x.numel() == 0) return;
  int64_t cols = x.size(-1);
  int64_t rows = x.numel() / cols;
  dispatch_floating(op, x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    parallel_for(rows, cols * 4, [&](int64_t row) {
      const T* in = px + row * cols;
      T* out = py + row * cols;
      T m = kNegInf;
      for (int64_t j = 0; j < cols; ++j) m = in[j] > m ? in[j] : m;
      if (m == kNegInf) {
        // No finite entry: all masked (softmax 0, log_softmax -inf); a NaN stays NaN.
        for (int64_t j = 0; j < cols; ++j) {
          out[j] = in[j] == kNegInf ? (kLog ? kNegInf : T(0)) : std::numeric_limits<T>::quiet_NaN();
        }
        return;
      }
      double sum = 0;
      if constexpr (kLog) {
        for (int64_t j = 0; j < cols; ++j) sum += double(std::exp(in[j] - m));
        T log_sum = T(std::log(sum));
        for (int64_t j = 0; j < cols; ++j) out[j] = (in[j] - m) - log_sum;
      } else {
        for (int64_t j = 0; j < cols; ++j) {
          T e = std::exp(in[j] - m);
          out[j] = e;
          sum += double(e);
        }
        T inv = T(1.0 / sum);
        for (int64_t j = 0; j < cols; ++j) out[j] *= inv;
      }
    });
  });
}

}  // namespace

void softmax(const Tensor& x, Tensor& y) { forward_rows<false>("softmax", x, y); }
void log_softmax(const Tensor& x, Tensor& y) { forward_rows<true>("log_softmax", x, y); }

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  int64_t cols = y.size(-1);
  int64_t rows = y.numel() / cols;
  dispatch_floating("softmax_backward", y.dtype(), [&]<class T>() {
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    // dx = y * (dy - <dy, y>)
    parallel_for(rows, cols * 3, [&](int64_t row) {
      const T* yr = py + row * cols;
      const T* dyr = pdy + row * cols;
      T* dxr = pdx + row * cols;
      double dot = 0;
      for (int64_t j = 0; j < cols; ++j) dot += double(dyr[j]) * double(yr[j]);
      T dot_t = T(dot);
      for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - dot_t);
    });
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  int64_t cols = y.size(-1);
  int64_t rows = y.numel() / cols;
  dispatch_floating("log_softmax_backward", y.dtype(), [&]<class T>() {
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    // dx = dy - exp(y) * sum(dy); masked (-inf) outputs are constants: they neither
    // take nor contribute gradient.
    parallel_for(rows, cols * 3, [&](int64_t row) {
      const T* yr = py + row * cols;
      const T* dyr = pdy + row * cols;
      T* dxr = pdx + row * cols;
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        if (yr[j] != kNegInf) sum += double(dyr[j]);
      }
      T sum_t = T(sum);
      for (int64_t j = 0; j < cols; ++j) {
        dxr[j] = yr[j] == kNegInf ? T(0) : dyr[j] - std::exp(yr[j]) * sum_t;
      }
    });
  });
}

}  // namespace ham::cpu
