#pragma once
// Differentiable softmax cross-entropy, fused (formulas in core/ops/cross_entropy.h).
// logits [N, V] (f32/bf16/f64; [..., V] with targets [...] also works), targets [N]
// (i32/i64). Rows whose target is ignore_index contribute nothing. The forward saves only
// the per-row logsumexp; dlogits = (softmax - onehot) * dloss (/ count for the mean). The
// loss is f32 for bf16 logits (mixed precision keeps the loss in f32), f64 for f64.
#include <cstdint>

#include "core/tensor.h"

namespace ham {

// 0-d mean over kept rows of (logsumexp(row) - row[target]); 0 (with zero gradient)
// when every row is ignored.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

struct CrossEntropyStats {
  Tensor loss;    // 0-d SUM over kept rows (divide by a total count after accumulating)
  int64_t count;  // kept rows
};
CrossEntropyStats cross_entropy_sum(const Tensor& logits, const Tensor& targets,
                                    int64_t ignore_index = -100);

}  // namespace ham
