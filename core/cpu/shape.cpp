#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/shape.h"

namespace ham::cpu {

namespace {

// Layout ops only move elements, so they dispatch on the element size, not the dtype.
template <class Fn>
void dispatch_element_size(DType dtype, Fn&& fn) {
  switch (dtype_size(dtype)) {
    case 1: fn.template operator()<uint8_t>(); return;
    case 2: fn.template operator()<uint16_t>(); return;
    case 4: fn.template operator()<uint32_t>(); return;
    case 8: fn.template operator()<uint64_t>(); return;
    default: HAM_FAIL("layout op: unsupported element size ", dtype_size(dtype));
  }
}

int64_t product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

// The index values as int64 (index tensors are small next to the data they address).
std::vector<int64_t> index_values(const char* op, const Tensor& index) {
  std::vector<int64_t> values(size_t(index.numel()));
  dispatch_index(op, index.dtype(), [&]<class I>() {
    const I* p = index.data<I>();
    for (size_t i = 0; i < values.size(); ++i) values[i] = int64_t(p[i]);
  });
  return values;
}

// The lines of a gather: positions of `index` that differ only in coordinate `dim`.
// Line l = (o, k) covers index positions (o * n + j) * inner + k for j < n, and they
// read/write x at base(l) + index[p] * x_stride[dim]. Distinct lines touch distinct x
// elements (index is no larger than x outside dim), so a scatter over lines is race-free.
struct GatherLines {
  int64_t outer = 1, n = 1, inner = 1, x_dim_stride = 1;
  std::vector<int64_t> outer_x_stride, inner_x_stride;
  Shape outer_shape, inner_shape;

  GatherLines(const Shape& x_shape, const Shape& index_shape, int64_t dim) {
    size_t d = size_t(dim);
    std::vector<int64_t> xs = contiguous_strides(x_shape);
    outer_shape.assign(index_shape.begin(), index_shape.begin() + int64_t(d));
    inner_shape.assign(index_shape.begin() + int64_t(d) + 1, index_shape.end());
    outer_x_stride.assign(xs.begin(), xs.begin() + int64_t(d));
    inner_x_stride.assign(xs.begin() + int64_t(d) + 1, xs.end());
    outer = product(index_shape, 0, d);
    n = index_shape[d];
    inner = product(index_shape, d + 1, index_shape.size());
    x_dim_stride = xs[d];
  }

  int64_t count() const { return outer * inner; }

  static int64_t offset(int64_t flat, const Shape& shape, const std::vector<int64_t>& strides) {
    int64_t off = 0;
    for (size_t k = shape.size(); k-- > 0;) {
      off += (flat % shape[k]) * strides[k];
      flat /= shape[k];
    }
    return off;
  }

  int64_t x_base(int64_t line) const {
    return offset(line / inner, outer_shape, outer_x_stride) +
           offset(line % inner, inner_shape, inner_x_stride);
  }
  int64_t index_pos(int64_t line, int64_t j) const {
    return ((line / inner) * n + j) * inner + line % inner;
  }
};

}  // namespace

void check_index_range(const char* op, const char* what, const Tensor& index, int64_t limit,
                       const std::string& why) {
  dispatch_index(op, index.dtype(), [&]<class I>() {
    const I* p = index.data<I>();
    int64_t n = index.numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = int64_t(p[i]);
      if (v >= 0 && v < limit) continue;
      Shape position(index.shape().size());
      int64_t flat = i;
      for (size_t k = position.size(); k-- > 0;) {
        position[k] = flat % index.shape()[k];
        flat /= index.shape()[k];
      }
      HAM_FAIL(op, ": ", what, " ", v, " at position ", shape_str(position), " of ", what, "s ",
               shape_str(index.shape()), " is outside [0, ", limit, ") (", why, ")");
    }
  });
}

void concat(const std::vector<Tensor>& xs, int64_t dim, Tensor& out) {
  const Shape& shape = out.shape();
  size_t d = size_t(dim);
  int64_t outer = product(shape, 0, d);
  int64_t inner = product(shape, d + 1, shape.size());
  int64_t out_row = shape[d] * inner;  // elements of out per outer index
  size_t esize = dtype_size(out.dtype());
  char* po = static_cast<char*>(out.raw_data());
  parallel_for(outer, out_row, [&](int64_t o) {
    int64_t at = 0;
    for (const Tensor& x : xs) {
      int64_t row = x.size(int64_t(d)) * inner;
      const char* px = static_cast<const char*>(x.raw_data());
      copy_bytes(po + size_t(o * out_row + at) * esize, px + size_t(o * row) * esize,
                 size_t(row) * esize);
      at += row;
    }
  });
}

void split(const Tensor& x, int64_t dim, std::vector<Tensor>& outs) {
  const Shape& shape = x.shape();
  size_t d = size_t(dim);
  int64_t outer = product(shape, 0, d);
  int64_t inner = product(shape, d + 1, shape.size());
  int64_t x_row = shape[d] * inner;
  size_t esize = dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.raw_data());
  parallel_for(outer, x_row, [&](int64_t o) {
    int64_t at = 0;
    for (Tensor& out : outs) {
      int64_t row = out.size(int64_t(d)) * inner;
      char* po = static_cast<char*>(out.raw_data());
      copy_bytes(po + size_t(o * row) * esize, px + size_t(o * x_row + at) * esize,
                 size_t(row) * esize);
      at += row;
    }
  });
}

void permute(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
  int64_t n = out.numel();
  if (n == 0) return;
  if (dims.empty()) {
    copy_bytes(out.raw_data(), x.raw_data(), dtype_size(x.dtype()));
    return;
  }
  std::vector<int64_t> xs = contiguous_strides(x.shape());
  const Shape& out_shape = out.shape();
  size_t rank = dims.size();
  std::vector<int64_t> src_stride(rank);  // x stride of each out dim
  for (size_t k = 0; k < rank; ++k) src_stride[k] = xs[size_t(dims[k])];
  int64_t last = out_shape[rank - 1];
  int64_t last_stride = src_stride[rank - 1];
  dispatch_element_size(x.dtype(), [&]<class E>() {
    const E* px = static_cast<const E*>(x.raw_data());
    E* po = static_cast<E*>(out.raw_data());
    // One output row (last dim) at a time: decode its leading coordinates once.
    parallel_for(n / last, last, [&](int64_t row) {
      int64_t base = 0, flat = row;
      for (size_t k = rank - 1; k-- > 0;) {
        base += (flat % out_shape[k]) * src_stride[k];
        flat /= out_shape[k];
      }
      E* dst = po + row * last;
      if (last_stride == 1) {
        std::copy(px + base, px + base + last, dst);
      } else {
        for (int64_t j = 0; j < last; ++j) dst[j] = px[base + j * last_stride];
      }
    });
  });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  int64_t limit = x.size(dim);
  check_index_range("gather", "index", index, limit,
                    "x " + shape_str(x.shape()) + " has size " + std::to_string(limit) +
                        " in dim " + std::to_string(dim));
  if (out.numel() == 0) return;
  GatherLines lines(x.shape(), index.shape(), dim);
  std::vector<int64_t> idx = index_values("gather", index);
  dispatch_element_size(x.dtype(), [&]<class E>() {
    const E* px = static_cast<const E*>(x.raw_data());
    E* po = static_cast<E*>(out.raw_data());
    parallel_for(lines.count(), lines.n, [&](int64_t line) {
      int64_t base = lines.x_base(line);
      for (int64_t j = 0; j < lines.n; ++j) {
        int64_t p = lines.index_pos(line, j);
        po[p] = px[base + idx[size_t(p)] * lines.x_dim_stride];
      }
    });
  });
}

void gather_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx) {
  int64_t limit = dx.size(dim);
  check_index_range("gather_backward", "index", index, limit,
                    "x " + shape_str(dx.shape()) + " has size " + std::to_string(limit) +
                        " in dim " + std::to_string(dim));
  if (dy.numel() == 0) return;
  GatherLines lines(dx.shape(), index.shape(), dim);
  std::vector<int64_t> idx = index_values("gather_backward", index);
  dispatch_floating("gather_backward", dy.dtype(), [&]<class T>() {
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    // Each line owns its x elements; within a line, j runs in order: deterministic.
    parallel_for(lines.count(), lines.n, [&](int64_t line) {
      int64_t base = lines.x_base(line);
      for (int64_t j = 0; j < lines.n; ++j) {
        int64_t p = lines.index_pos(line, j);
        pdx[base + idx[size_t(p)] * lines.x_dim_stride] += pdy[p];
      }
    });
  });
}

void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  const Shape& shape = x.shape();
  size_t d = size_t(dim);
  int64_t limit = shape[d];
  check_index_range("index_select", "index", index, limit,
                    "x " + shape_str(shape) + " has size " + std::to_string(limit) + " in dim " +
                        std::to_string(dim));
  if (out.numel() == 0) return;
  int64_t outer = product(shape, 0, d);
  int64_t inner = product(shape, d + 1, shape.size());
  int64_t n = index.numel();
  std::vector<int64_t> idx = index_values("index_select", index);
  size_t esize = dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  // out[o, j, :] = x[o, idx[j], :]
  parallel_for(outer * n, inner, [&](int64_t row) {
    int64_t o = row / n, j = row % n;
    copy_bytes(po + size_t(row * inner) * esize,
               px + size_t((o * limit + idx[size_t(j)]) * inner) * esize, size_t(inner) * esize);
  });
}

void index_select_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx) {
  const Shape& shape = dx.shape();
  size_t d = size_t(dim);
  int64_t limit = shape[d];
  check_index_range("index_select_backward", "index", index, limit,
                    "x " + shape_str(shape) + " has size " + std::to_string(limit) + " in dim " +
                        std::to_string(dim));
  if (dy.numel() == 0) return;
  int64_t outer = product(shape, 0, d);
  int64_t inner = product(shape, d + 1, shape.size());
  int64_t n = index.numel();
  std::vector<int64_t> idx = index_values("index_select_backward", index);
  // Work items are (outer row, column chunk); each owns its dx columns and adds the
  // selected rows in index order, so the sums are deterministic.
  constexpr int64_t kChunk = 256;
  int64_t chunks = (inner + kChunk - 1) / kChunk;
  dispatch_floating("index_select_backward", dy.dtype(), [&]<class T>() {
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(outer * chunks, n * std::min(inner, kChunk), [&](int64_t item) {
      int64_t o = item / chunks;
      int64_t c0 = (item % chunks) * kChunk, c1 = std::min(inner, c0 + kChunk);
      for (int64_t j = 0; j < n; ++j) {
        T* dst = pdx + (o * limit + idx[size_t(j)]) * inner;
        const T* src = pdy + (o * n + j) * inner;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    });
  });
}

}  // namespace ham::cpu
