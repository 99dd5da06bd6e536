#pragma once
// The fused multi-tensor AdamW of the CUDA backend (cuda/optim.cu), as a list of entries.
// It is also the CUDA kernel of core's ops::adamw_step_multi (four parallel lists), which is
// how nn's AdamW reaches it without depending on cuda/. Pure C++, so tests can call it in a
// CUDA build (HAM_WITH_CUDA).
//   p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Mixed precision: fp32 params (master weights) and moments with f32 or bf16 gradients,
// or bf16 params with f32 moments; f64 throughout also works. Every entry of one call
// shares its dtypes and device.
#include <vector>

#include "core/ops/optim.h"
#include "core/tensor.h"

namespace ham::cuda {

struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;  // same shape each; param and moments updated
};

// One kernel launch updates every tensor of `list` (chunks of each tensor become blocks).
void adamw_step_multi_tensor(const std::vector<AdamWTensors>& list, const AdamWHyper& hyper);

}  // namespace ham::cuda
