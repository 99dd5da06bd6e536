#include "nn/shape.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/shape.h"

namespace ham {

namespace {

class ConcatBackward final : public Node {
 public:
  std::vector<int64_t> sizes;
  int64_t dim = 0;
  std::string name() const override { return "ConcatBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return ops::split(grads[0], sizes, dim);
  }
};

class SplitBackward final : public Node {
 public:
  int64_t dim = 0;
  std::string name() const override { return "SplitBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::concat(grads, dim)};
  }
};

class PermuteBackward final : public Node {
 public:
  std::vector<int64_t> inverse_dims;
  std::string name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::permute(grads[0], inverse_dims)};
  }
};

class GatherBackward final : public Node {
 public:
  Tensor index;
  int64_t dim = 0;
  Shape x_shape;
  std::string name() const override { return "GatherBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::gather_backward(grads[0], dim, index, x_shape)};
  }
  void release_saved() override { index = Tensor(); }
};

class IndexSelectBackward final : public Node {
 public:
  Tensor index;
  int64_t dim = 0;
  Shape x_shape;
  std::string name() const override { return "IndexSelectBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::index_select_backward(grads[0], dim, index, x_shape)};
  }
  void release_saved() override { index = Tensor(); }
};

}  // namespace

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor y = ops::concat(xs, dim);
  if (any_requires_grad(xs)) {
    auto node = std::make_shared<ConcatBackward>();
    node->dim = ops::normalize_dim("concat", dim, y.shape());
    for (const Tensor& x : xs) node->sizes.push_back(x.size(node->dim));
    connect(node, xs, {&y});
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> ys = ops::split(x, sizes, dim);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<SplitBackward>();
    node->dim = ops::normalize_dim("split", dim, x.shape());
    std::vector<Tensor*> outputs;
    for (Tensor& y : ys) outputs.push_back(&y);
    connect(node, {x}, outputs);
  }
  return ys;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = ops::permute(x, dims);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<PermuteBackward>();
    std::vector<int64_t> normalized;
    for (int64_t d : dims) normalized.push_back(ops::normalize_dim("permute", d, x.shape()));
    node->inverse_dims = ops::inverse_permutation(normalized);
    connect(node, {x}, {&y});
  }
  return y;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(size_t(x.dim()));
  for (size_t k = 0; k < dims.size(); ++k) dims[k] = int64_t(k);
  std::swap(dims[size_t(ops::normalize_dim("transpose", d0, x.shape()))],
            dims[size_t(ops::normalize_dim("transpose", d1, x.shape()))]);
  return permute(x, dims);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = ops::gather(x, dim, index);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<GatherBackward>();
    node->index = index;
    node->dim = ops::normalize_dim("gather", dim, x.shape());
    node->x_shape = x.shape();
    connect(node, {x}, {&y});
  }
  return y;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = ops::index_select(x, dim, index);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<IndexSelectBackward>();
    node->index = index;
    node->dim = ops::normalize_dim("index_select", dim, x.shape());
    node->x_shape = x.shape();
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace ham
