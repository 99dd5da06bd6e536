#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/elementwise.h"

namespace ham::cpu {

namespace {

// Strides (in elements) of `shape` seen through the broadcast `out` shape: 0 where the
// dim is stretched.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    size_t d = shape.size() - 1 - i;
    size_t o = out.size() - 1 - i;
    strides[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

template <class T>
T apply(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
  }
  return T(0);
}

// Maps a flat index of `out` to element offsets of a and b.
struct BroadcastIndexer {
  Shape out;
  std::vector<int64_t> sa, sb;
  void offsets(int64_t flat, int64_t& ia, int64_t& ib) const {
    ia = ib = 0;
    for (int64_t d = int64_t(out.size()) - 1; d >= 0; --d) {
      int64_t idx = flat % out[size_t(d)];
      flat /= out[size_t(d)];
      ia += idx * sa[size_t(d)];
      ib += idx * sb[size_t(d)];
    }
  }
};

// True when `s`, less its leading 1s, equals the last dims of `out` (a bias-like operand).
bool is_trailing_block(const Shape& s, const Shape& out) {
  size_t k = 0;
  while (k < s.size() && s[k] == 1) ++k;
  size_t len = s.size() - k;
  if (len > out.size()) return false;
  return std::equal(s.begin() + int64_t(k), s.end(), out.end() - int64_t(len));
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_floating(binary_op_name(op), a.dtype(), [&]<class T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    int64_t n = out.numel();
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
      parallel_for(n, 1, [&](int64_t i) { po[i] = apply(op, pa[i], pb[i]); });
      return;
    }
    if (a.shape() == out.shape() && is_trailing_block(b.shape(), out.shape())) {
      int64_t inner = b.numel();
      parallel_for(n / inner, inner, [&](int64_t row) {
        for (int64_t j = 0; j < inner; ++j) {
          po[row * inner + j] = apply(op, pa[row * inner + j], pb[j]);
        }
      });
      return;
    }
    BroadcastIndexer ix{out.shape(), broadcast_strides(a.shape(), out.shape()),
                        broadcast_strides(b.shape(), out.shape())};
    parallel_for(n, 8, [&](int64_t i) {
      int64_t ia, ib;
      ix.offsets(i, ia, ib);
      po[i] = apply(op, pa[ia], pb[ib]);
    });
  });
}

void axpy(double alpha, const Tensor& src, Tensor& dst) {
  dispatch_floating("axpy_", dst.dtype(), [&]<class T>() {
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    T a = T(alpha);
    parallel_for(dst.numel(), 1, [&](int64_t i) { d[i] += a * s[i]; });
  });
}

void scale(double alpha, Tensor& x) {
  dispatch_floating("scale_", x.dtype(), [&]<class T>() {
    T* p = x.data<T>();
    T a = T(alpha);
    parallel_for(x.numel(), 1, [&](int64_t i) { p[i] *= a; });
  });
}

void sum_to(const Tensor& in, Tensor& out) {
  dispatch_floating("sum_to", in.dtype(), [&]<class T>() {
    const T* pi = in.data<T>();
    T* po = out.data<T>();
    int64_t n_out = out.numel();
    if (n_out > 0 && is_trailing_block(out.shape(), in.shape())) {
      // Sum rows of a [rows, n_out] matrix: parallel over columns, rows in order.
      int64_t rows = in.numel() / n_out;
      parallel_for(n_out, rows, [&](int64_t j) {
        T acc = T(0);
        for (int64_t r = 0; r < rows; ++r) acc += pi[r * n_out + j];
        po[j] = acc;
      });
      return;
    }
    std::vector<int64_t> so = broadcast_strides(out.shape(), in.shape());
    // Serial over input, accumulating in the output's precision; deterministic.
    for (int64_t j = 0; j < n_out; ++j) po[j] = T(0);
    const Shape& shape = in.shape();
    int64_t n = in.numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t flat = i, offset = 0;
      for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
        offset += (flat % shape[size_t(d)]) * so[size_t(d)];
        flat /= shape[size_t(d)];
      }
      po[offset] += pi[i];
    }
  });
}

}  // namespace ham::cpu
