#include "core/ops/shape.h"

#include <cstdint>
#include <string>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(concat, &cpu::concat,
                        void(const std::vector<Tensor>& xs, int64_t dim, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(split, &cpu::split,
                        void(const Tensor& x, int64_t dim, std::vector<Tensor>& outs))
HAM_DEFINE_KERNEL_TABLE(permute, &cpu::permute,
                        void(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(gather, &cpu::gather,
                        void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(gather_backward, &cpu::gather_backward,
                        void(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx))
HAM_DEFINE_KERNEL_TABLE(index_select, &cpu::index_select,
                        void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(index_select_backward, &cpu::index_select_backward,
                        void(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx))

namespace ops {

namespace {

void check_index_tensor(const char* op, const Tensor& index, const Tensor& x) {
  HAM_CHECK(index.dtype() == DType::I32 || index.dtype() == DType::I64, op,
            ": index must be i32 or i64, got ", index.str());
  check_same_device(op, x, index);
}

}  // namespace

int64_t normalize_dim(const char* op, int64_t dim, const Shape& shape) {
  int64_t rank = int64_t(shape.size());
  HAM_CHECK(dim >= -rank && dim < rank, op, ": dim ", dim, " out of range for shape ",
            shape_str(shape));
  return dim < 0 ? dim + rank : dim;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  HAM_CHECK(!xs.empty(), "concat: no tensors given");
  const Tensor& first = xs[0];
  int64_t d = normalize_dim("concat", dim, first.shape());
  Shape out_shape = first.shape();
  out_shape[size_t(d)] = 0;
  for (const Tensor& x : xs) {
    bool same_rank = x.dim() == first.dim();
    bool same_outside = same_rank;
    for (int64_t k = 0; same_rank && k < x.dim(); ++k) {
      if (k != d && x.size(k) != first.size(k)) same_outside = false;
    }
    HAM_CHECK(same_outside, "concat: shapes ", shape_str(first.shape()), " and ",
              shape_str(x.shape()), " differ outside dim ", dim);
    HAM_CHECK(x.dtype() == first.dtype(), "concat: dtypes differ (", first.str(), " and ", x.str(),
              ")");
    check_same_device("concat", first, x);
    out_shape[size_t(d)] += x.size(d);
  }
  Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
  concat_kernels()(first.device(), xs, d, out);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = normalize_dim("split", dim, x.shape());
  HAM_CHECK(!sizes.empty(), "split: no sizes given for x ", shape_str(x.shape()));
  int64_t total = 0;
  for (int64_t s : sizes) {
    HAM_CHECK(s >= 0, "split: negative size in ", shape_str(sizes), " for x ",
              shape_str(x.shape()));
    total += s;
  }
  HAM_CHECK(total == x.size(d), "split: sizes ", shape_str(sizes), " sum to ", total, " but x ",
            shape_str(x.shape()), " has ", x.size(d), " in dim ", dim);
  std::vector<Tensor> outs;
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[size_t(d)] = s;
    outs.push_back(Tensor::empty(shape, x.dtype(), x.device()));
  }
  split_kernels()(x.device(), x, d, outs);
  return outs;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  HAM_CHECK(int64_t(dims.size()) == x.dim(), "permute: dims ", shape_str(dims),
            " do not match the rank of x ", shape_str(x.shape()));
  std::vector<int64_t> normalized(dims.size());
  std::vector<bool> used(dims.size(), false);
  Shape out_shape(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    int64_t d = normalize_dim("permute", dims[k], x.shape());
    HAM_CHECK(!used[size_t(d)], "permute: dims ", shape_str(dims), " are not a permutation for x ",
              shape_str(x.shape()));
    used[size_t(d)] = true;
    normalized[k] = d;
    out_shape[k] = x.size(d);
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  permute_kernels()(x.device(), x, normalized, out);
  return out;
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims) {
  std::vector<int64_t> inverse(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) inverse[size_t(dims[k])] = int64_t(k);
  return inverse;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(size_t(x.dim()));
  for (size_t k = 0; k < dims.size(); ++k) dims[k] = int64_t(k);
  std::swap(dims[size_t(normalize_dim("transpose", d0, x.shape()))],
            dims[size_t(normalize_dim("transpose", d1, x.shape()))]);
  return permute(x, dims);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  int64_t d = normalize_dim("gather", dim, x.shape());
  check_index_tensor("gather", index, x);
  bool fits = index.dim() == x.dim();
  for (int64_t k = 0; fits && k < x.dim(); ++k) {
    if (k != d && index.size(k) > x.size(k)) fits = false;
  }
  HAM_CHECK(fits, "gather: index ", shape_str(index.shape()), " does not fit x ",
            shape_str(x.shape()), " (same rank, and no larger outside dim ", dim, ")");
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  gather_kernels()(x.device(), x, d, index, out);
  return out;
}

Tensor gather_backward(const Tensor& dy, int64_t dim, const Tensor& index, const Shape& x_shape) {
  int64_t d = normalize_dim("gather_backward", dim, x_shape);
  check_index_tensor("gather_backward", index, dy);
  HAM_CHECK(dy.shape() == index.shape(), "gather_backward: dy ", shape_str(dy.shape()),
            " does not match index ", shape_str(index.shape()));
  Tensor dx = Tensor::zeros(x_shape, dy.dtype(), dy.device());
  gather_backward_kernels()(dy.device(), dy, d, index, dx);
  return dx;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  int64_t d = normalize_dim("index_select", dim, x.shape());
  check_index_tensor("index_select", index, x);
  HAM_CHECK(index.dim() == 1, "index_select: index must be 1-D, got ", shape_str(index.shape()),
            " for x ", shape_str(x.shape()));
  Shape out_shape = x.shape();
  out_shape[size_t(d)] = index.size(0);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  index_select_kernels()(x.device(), x, d, index, out);
  return out;
}

Tensor index_select_backward(const Tensor& dy, int64_t dim, const Tensor& index,
                             const Shape& x_shape) {
  int64_t d = normalize_dim("index_select_backward", dim, x_shape);
  check_index_tensor("index_select_backward", index, dy);
  Shape expected = x_shape;
  expected[size_t(d)] = index.dim() == 1 ? index.size(0) : -1;
  HAM_CHECK(dy.shape() == expected, "index_select_backward: dy ", shape_str(dy.shape()),
            " does not match x ", shape_str(x_shape), " with index ", shape_str(index.shape()));
  Tensor dx = Tensor::zeros(x_shape, dy.dtype(), dy.device());
  index_select_backward_kernels()(dy.device(), dy, d, index, dx);
  return dx;
}

}  // namespace ops
}  // namespace ham
