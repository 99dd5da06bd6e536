// CUDA kernels of core/ops/shape.h (dims already normalised):
//   concat(xs, d):  out[.., o_i + j, ..] = xs[i][.., j, ..]   (one strided 2-D copy per input)
//   split(x, d):    the inverse of concat
//   permute(x, dims): out[i] = x[j], j[dims[k]] = i[k]
//   gather(x, d, idx):       out[i] = x[i with coordinate d replaced by idx[i]]
//   gather_backward:         dx[.., idx[i], ..] += dy[i]
//   index_select(x, d, idx): out[.., j, ..] = x[.., idx[j], ..]
//   index_select_backward:   dx[.., idx[j], ..] += dy[.., j, ..]
// Copies move elements by size, so they serve every dtype. The scatter-adds are
// deterministic like the CPU's: one thread owns a set of dx elements and adds in index
// order (gather: one thread per line along d; index_select: one thread per (outer,
// column)). bf16 gradients are summed in an f32 copy of dx and rounded once at the end.
// Indices are range-checked on the device first, with the CPU kernel's message.
#include <cstdint>
#include <string>
#include <vector>

#include "core/ops/shape.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

constexpr int kMaxDims = 8;

struct Dims {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // meaning depends on the kernel
};

int64_t product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) strides[k - 1] = strides[k] * shape[k];
  return strides;
}

Dims make_dims(const char* op, const Shape& shape, const std::vector<int64_t>& strides) {
  HAM_CHECK(shape.size() <= size_t(kMaxDims), op, ": CUDA kernel takes at most ", kMaxDims,
            " dims, got ", shape_str(shape));
  Dims d;
  d.rank = int(shape.size());
  for (size_t k = 0; k < shape.size(); ++k) {
    d.size[k] = shape[k];
    d.stride[k] = strides[k];
  }
  return d;
}

// Offset of flat index `flat` of a tensor shaped d.size, through d.stride.
__device__ __forceinline__ int64_t strided_offset(int64_t flat, const Dims& d) {
  int64_t offset = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    offset += (flat % d.size[k]) * d.stride[k];
    flat /= d.size[k];
  }
  return offset;
}

// ---- concat / split: strided 2-D copies [outer rows of row_i elements] ----

void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height) {
  if (width == 0 || height == 0) return;
  HAM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                   cudaMemcpyDeviceToDevice, launch_stream()));
}

void concat(const std::vector<Tensor>& xs, int64_t dim, Tensor& out) {
  const Shape& shape = out.shape();
  const size_t d = size_t(dim);
  const int64_t outer = product(shape, 0, d), inner = product(shape, d + 1, shape.size());
  const size_t esize = dtype_size(out.dtype());
  const size_t out_row = size_t(shape[d] * inner) * esize;
  use_device_of(out);
  size_t at = 0;
  for (const Tensor& x : xs) {
    const size_t row = size_t(x.size(dim) * inner) * esize;
    copy_rows(static_cast<char*>(out.raw_data()) + at, out_row, x.raw_data(), row, row,
              size_t(outer));
    at += row;
  }
}

void split(const Tensor& x, int64_t dim, std::vector<Tensor>& outs) {
  const Shape& shape = x.shape();
  const size_t d = size_t(dim);
  const int64_t outer = product(shape, 0, d), inner = product(shape, d + 1, shape.size());
  const size_t esize = dtype_size(x.dtype());
  const size_t x_row = size_t(shape[d] * inner) * esize;
  use_device_of(x);
  size_t at = 0;
  for (Tensor& out : outs) {
    const size_t row = size_t(out.size(dim) * inner) * esize;
    copy_rows(out.raw_data(), row, static_cast<const char*>(x.raw_data()) + at, x_row, row,
              size_t(outer));
    at += row;
  }
}

// ---- permute ----

// out[i] = x[strided_offset(i, source)]: source.size = out's shape, source.stride = the
// x stride of each out dim.
template <class E>
__global__ void permute_kernel(const E* x, E* out, int64_t n, Dims source) {
  HAM_GRID_STRIDE_LOOP(i, n) out[i] = x[strided_offset(i, source)];
}

void permute(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  use_device_of(x);
  std::vector<int64_t> xs = contiguous_strides(x.shape());
  std::vector<int64_t> src_stride(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) src_stride[k] = xs[size_t(dims[k])];
  Dims source = make_dims("permute", out.shape(), src_stride);
  dispatch_element_size("permute", x.dtype(), [&]<class E>() {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), permute_kernel)(
        ptr<const E>(x), ptr<E>(out), n, source);
    HAM_CUDA_CHECK_LAUNCH();
  });
}

// ---- gather ----

// Offset into x of index position p with coordinate `dim` replaced by `value`:
// index.size = index's shape, index.stride = x's contiguous strides.
__device__ __forceinline__ int64_t gather_offset(int64_t p, const Dims& index, int dim,
                                                 int64_t value) {
  int64_t offset = 0;
  for (int k = index.rank - 1; k >= 0; --k) {
    const int64_t coord = k == dim ? value : p % index.size[k];
    offset += coord * index.stride[k];
    p /= index.size[k];
  }
  return offset;
}

template <class E, class I>
__global__ void gather_kernel(const E* x, const I* idx, E* out, int64_t n, Dims index, int dim) {
  HAM_GRID_STRIDE_LOOP(p, n) out[p] = x[gather_offset(p, index, dim, int64_t(idx[p]))];
}

// One thread per line (positions differing only in coordinate dim), j in order.
template <class T, class A, class I>
__global__ void gather_backward_kernel(const T* dy, const I* idx, A* dx, int64_t lines,
                                       int64_t n, int64_t inner, Dims index, int dim) {
  HAM_GRID_STRIDE_LOOP(line, lines) {
    const int64_t o = line / inner, k = line % inner;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = (o * n + j) * inner + k;
      A* dst = dx + gather_offset(p, index, dim, int64_t(idx[p]));
      *dst = store<A>(load(*dst) + load(dy[p]));
    }
  }
}

// ---- index_select ----

template <class E, class I>
__global__ void index_select_kernel(const E* x, const I* idx, E* out, int64_t total,
                                    int64_t n, int64_t inner, int64_t limit) {
  HAM_GRID_STRIDE_LOOP(i, total) {  // i = (o * n + j) * inner + c
    const int64_t row = i / inner, c = i % inner, o = row / n, j = row % n;
    out[i] = x[(o * limit + int64_t(idx[j])) * inner + c];
  }
}

// One thread per (o, c): dx[o, idx[j], c] += dy[o, j, c] for j in order.
template <class T, class A, class I>
__global__ void index_select_backward_kernel(const T* dy, const I* idx, A* dx, int64_t columns,
                                             int64_t n, int64_t inner, int64_t limit) {
  HAM_GRID_STRIDE_LOOP(oc, columns) {
    const int64_t o = oc / inner, c = oc % inner;
    for (int64_t j = 0; j < n; ++j) {
      A* dst = dx + (o * limit + int64_t(idx[j])) * inner + c;
      *dst = store<A>(load(*dst) + load(dy[(o * n + j) * inner + c]));
    }
  }
}

// ---- bf16 accumulation ----

template <class From, class To>
__global__ void convert_kernel(const From* in, To* out, int64_t n) {
  HAM_GRID_STRIDE_LOOP(i, n) out[i] = store<To>(load(in[i]));
}

// Runs scatter<A>(A* acc) on dx itself (f32, f64) or, for bf16, on an f32 copy of dx
// that is rounded back into dx afterwards.
template <class T, class Scatter>
void accumulate_into(Tensor& dx, Scatter&& scatter) {
  if constexpr (std::is_same_v<T, bf16>) {
    const int64_t n = dx.numel();
    Tensor acc = Tensor::empty(dx.shape(), DType::F32, dx.device());
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), convert_kernel)(
        ptr<const bf16>(dx), ptr<float>(acc), n);
    HAM_CUDA_CHECK_LAUNCH();
    scatter.template operator()<float>(ptr<float>(acc));
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), convert_kernel)(
        ptr<const float>(acc), ptr<bf16>(dx), n);
    HAM_CUDA_CHECK_LAUNCH();
  } else {
    scatter.template operator()<T>(ptr<T>(dx));
  }
}

std::string size_reason(const Shape& x_shape, int64_t dim) {
  return "x " + shape_str(x_shape) + " has size " + std::to_string(x_shape[size_t(dim)]) +
         " in dim " + std::to_string(dim);
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  use_device_of(x);
  check_index_range("gather", "index", index, x.size(dim), size_reason(x.shape(), dim));
  const int64_t n = out.numel();
  if (n == 0) return;
  Dims dims = make_dims("gather", index.shape(), contiguous_strides(x.shape()));
  dispatch_element_size("gather", x.dtype(), [&]<class E>() {
    dispatch_index("gather", index.dtype(), [&]<class I>() {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), gather_kernel)(
          ptr<const E>(x), ptr<const I>(index), ptr<E>(out), n, dims, int(dim));
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

void gather_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx) {
  use_device_of(dy);
  check_index_range("gather_backward", "index", index, dx.size(dim),
                    size_reason(dx.shape(), dim));
  if (dy.numel() == 0) return;
  const Shape& is = index.shape();
  const int64_t n = is[size_t(dim)], inner = product(is, size_t(dim) + 1, is.size());
  const int64_t lines = product(is, 0, size_t(dim)) * inner;
  Dims dims = make_dims("gather_backward", is, contiguous_strides(dx.shape()));
  dispatch_floating("gather_backward", dy.dtype(), [&]<class T>() {
    dispatch_index("gather_backward", index.dtype(), [&]<class I>() {
      accumulate_into<T>(dx, [&]<class A>(A* acc) {
        HAM_LAUNCH(grid_for(lines), kThreads, 0, launch_stream(), gather_backward_kernel)(
            ptr<const T>(dy), ptr<const I>(index), acc, lines, n, inner, dims, int(dim));
        HAM_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  const Shape& shape = x.shape();
  const int64_t limit = shape[size_t(dim)];
  use_device_of(x);
  check_index_range("index_select", "index", index, limit, size_reason(shape, dim));
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t inner = product(shape, size_t(dim) + 1, shape.size()), n = index.numel();
  dispatch_element_size("index_select", x.dtype(), [&]<class E>() {
    dispatch_index("index_select", index.dtype(), [&]<class I>() {
      HAM_LAUNCH(grid_for(total), kThreads, 0, launch_stream(), index_select_kernel)(
          ptr<const E>(x), ptr<const I>(index), ptr<E>(out), total, n, inner, limit);
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

void index_select_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx) {
  const Shape& shape = dx.shape();
  const int64_t limit = shape[size_t(dim)];
  use_device_of(dy);
  check_index_range("index_select_backward", "index", index, limit, size_reason(shape, dim));
  if (dy.numel() == 0) return;
  const int64_t outer = product(shape, 0, size_t(dim));
  const int64_t inner = product(shape, size_t(dim) + 1, shape.size()), n = index.numel();
  const int64_t columns = outer * inner;
  dispatch_floating("index_select_backward", dy.dtype(), [&]<class T>() {
    dispatch_index("index_select_backward", index.dtype(), [&]<class I>() {
      accumulate_into<T>(dx, [&]<class A>(A* acc) {
        HAM_LAUNCH(grid_for(columns), kThreads, 0, launch_stream(), index_select_backward_kernel)(
            ptr<const T>(dy), ptr<const I>(index), acc, columns, n, inner, limit);
        HAM_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

const bool registered = [] {
  concat_kernels().register_kernel(DeviceKind::CUDA, &concat);
  split_kernels().register_kernel(DeviceKind::CUDA, &split);
  permute_kernels().register_kernel(DeviceKind::CUDA, &permute);
  gather_kernels().register_kernel(DeviceKind::CUDA, &gather);
  gather_backward_kernels().register_kernel(DeviceKind::CUDA, &gather_backward);
  index_select_kernels().register_kernel(DeviceKind::CUDA, &index_select);
  index_select_backward_kernels().register_kernel(DeviceKind::CUDA, &index_select_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
