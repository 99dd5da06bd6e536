#include <cstdint>

#include "core/ops/embedding.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(embedding, &cpu::embedding,
                        void(const Tensor& weight, const Tensor& ids, Tensor& out))
HAM_DEFINE_KERNEL_TABLE(embedding_backward, &cpu::embedding_backward,
                        void(const Tensor& dy, const Tensor& ids, Tensor& dweight))

namespace ops {

namespace {

void check_ids(const char* op, const Tensor& ids, const Tensor& other) {
  HAM_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, op,
            ": ids must be i32 or i64, got ", ids.str());
  check_same_device(op, other, ids);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  HAM_CHECK(weight.dim() == 2, "embedding: weight must be [V, D], got ",
            shape_str(weight.shape()));
  check_ids("embedding", ids, weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  embedding_kernels()(weight.device(), weight, ids, out);
  return out;
}

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab_size) {
  check_ids("embedding_backward", ids, dy);
  Shape expected = ids.shape();
  expected.push_back(dy.dim() >= 1 ? dy.size(-1) : -1);
  HAM_CHECK(dy.shape() == expected, "embedding_backward: dy ", shape_str(dy.shape()),
            " does not match ids ", shape_str(ids.shape()), " + [D]");
  Tensor dweight = Tensor::zeros({vocab_size, dy.size(-1)}, dy.dtype(), dy.device());
  embedding_backward_kernels()(dy.device(), dy, ids, dweight);
  return dweight;
}

}  // namespace ops
}  // namespace ham
