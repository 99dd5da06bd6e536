#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/rope.h"

namespace ham::cpu {

namespace {

// Rotates every (x_i, x_{i+D/2}) pair by sign * pos * base^(-2i/D). The cosines and sines
// are computed once per position, not once per row: a batch repeats positions [0, T).
void rotate(const char* op, const Tensor& x, double base, const Tensor& positions, double sign,
            Tensor& y) {
  if (x.numel() == 0) return;
  int64_t batch = x.size(0), seq = x.size(1), heads = x.size(2), dim = x.size(3);
  int64_t half = dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[size_t(i)] = std::pow(base, -2.0 * double(i) / double(dim));
  }
  std::vector<int64_t> pos(size_t(batch * seq));
  if (positions.defined()) {
    dispatch_index(op, positions.dtype(), [&]<class I>() {
      const I* p = positions.data<I>();
      for (size_t k = 0; k < pos.size(); ++k) pos[k] = int64_t(p[k]);
    });
  } else {
    for (size_t k = 0; k < pos.size(); ++k) pos[k] = int64_t(k) % seq;
  }
  // Rows of the angle table: one per position up to the largest, unless that is more
  // positions than rows (a decode step far into a sequence), then one per row.
  const auto [smallest, largest] = std::minmax_element(pos.begin(), pos.end());
  const bool by_position = *smallest >= 0 && *largest < int64_t(pos.size());
  const int64_t table_rows = by_position ? *largest + 1 : int64_t(pos.size());
  dispatch_floating(op, x.dtype(), [&]<class T>() {
    std::vector<T> cosines(size_t(table_rows * half)), sines(size_t(table_rows * half));
    parallel_for(table_rows, half * 40, [&](int64_t r) {
      const double position = double(by_position ? r : pos[size_t(r)]);
      for (int64_t i = 0; i < half; ++i) {
        double angle = position * inv_freq[size_t(i)];
        cosines[size_t(r * half + i)] = T(std::cos(angle));
        sines[size_t(r * half + i)] = T(sign * std::sin(angle));
      }
    });
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(batch * seq, heads * dim * 2, [&](int64_t bt) {
      const T* in = px + bt * heads * dim;
      T* out = py + bt * heads * dim;
      const int64_t row = by_position ? pos[size_t(bt)] : bt;
      const T* cos_row = cosines.data() + row * half;
      const T* sin_row = sines.data() + row * half;
      for (int64_t i = 0; i < half; ++i) {
        T c = cos_row[i], s = sin_row[i];
        for (int64_t h = 0; h < heads; ++h) {
          T a = in[h * dim + i], b = in[h * dim + i + half];
          out[h * dim + i] = a * c - b * s;
          out[h * dim + i + half] = b * c + a * s;
        }
      }
    });
  });
}

}  // namespace

void rope(const Tensor& x, double base, const Tensor& positions, Tensor& y) {
  rotate("rope", x, base, positions, 1.0, y);
}

void rope_backward(const Tensor& dy, double base, const Tensor& positions, Tensor& dx) {
  rotate("rope_backward", dy, base, positions, -1.0, dx);
}

}  // namespace ham::cpu
