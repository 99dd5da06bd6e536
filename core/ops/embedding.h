#pragma once
// Embedding lookup: weight [V, D], ids (any shape, i32/i64) -> out [ids.shape..., D]
//   out[p, :] = weight[ids[p], :]
// Backward: dweight[v, :] = sum over positions p with ids[p] == v of dy[p, :], summed in
// position order (deterministic). An id outside [0, V) is an error naming the id, its
// position and V.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(embedding, void(const Tensor& weight, const Tensor& ids, Tensor& out));
// dweight (zeroed by the caller) += scatter of dy rows at ids
HAM_DECLARE_KERNEL_TABLE(embedding_backward,
                         void(const Tensor& dy, const Tensor& ids, Tensor& dweight));

namespace ops {

Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab_size);

}  // namespace ops

namespace cpu {
void embedding(const Tensor& weight, const Tensor& ids, Tensor& out);
void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dweight);
}  // namespace cpu

}  // namespace ham
