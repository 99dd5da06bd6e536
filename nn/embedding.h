#pragma once
// Differentiable embedding lookup: weight [V, D], ids (any shape, i32/i64) -> [ids..., D].
//   out[p, :] = weight[ids[p], :];  dweight[v, :] = sum_{p: ids[p] = v} dy[p, :]
// The scatter-add is deterministic. An id outside [0, V) throws, naming the id, its
// position and V.
#include "core/tensor.h"

namespace ham {

Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace ham
