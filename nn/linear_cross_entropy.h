#pragma once
// Differentiable fused linear cross-entropy: an LM head (no bias) and softmax
// cross-entropy in one op that never materialises the [N, V] logits (formulas and the
// chunking in core/ops/linear_cross_entropy.h).
//   loss = mean over kept rows r of CE(hidden_r W^T, targets_r)
// hidden [N, D] ([..., D] with targets [...] also works), weight [V, D] (f32/f64, one
// dtype), targets [N] (i32/i64). Rows whose target is ignore_index contribute nothing.
// chunk_rows: rows per chunk, 0 = at most 2^23 logits per chunk on the CPU, 2^28 on CUDA.
// When grad mode is on and hidden or weight requires grad, the forward also computes the
// gradients of the summed loss chunk by chunk (3 GEMMs per chunk instead of 1) and keeps
// them ([N, D] and [V, D]) until the backward, which scales them by the incoming
// gradient (/ count for the mean); under no-grad only the loss is computed.
#include <cstdint>

#include "core/tensor.h"
#include "nn/cross_entropy.h"

namespace ham {

// 0-d mean over kept rows of (logsumexp(hidden_r W^T) - (hidden_r W^T)[target_r]); 0 (with
// zero gradients) when every row is ignored.
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index = -100, int64_t chunk_rows = 0);

// The 0-d SUM over kept rows and the kept-row count (as cross_entropy_sum).
CrossEntropyStats linear_cross_entropy_sum(const Tensor& hidden, const Tensor& weight,
                                           const Tensor& targets, int64_t ignore_index = -100,
                                           int64_t chunk_rows = 0);

}  // namespace ham
