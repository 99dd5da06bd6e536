#pragma once
// Fused softmax cross-entropy over rows of logits [..., V] with integer targets [...]
// (i32 or i64); rows whose target is ignore_index take no part.
//   lse_r  = logsumexp(logits_r) = m + log(sum_j e^(logits_rj - m)),  m = max_j logits_rj
//   loss   = sum over kept rows of (lse_r - logits_r[target_r])
//   dlogits_rj = (e^(logits_rj - lse_r) - [j == target_r]) * dloss * scale  (0 on ignored rows)
// The forward saves only lse; the backward rebuilds the softmax from logits and lse.
// `scale` is 1 for a summed loss, 1 / count for a mean. lse, the loss and its gradient are
// f32 for f32 and bf16 logits (a bf16 lse would be off by up to |lse| 2^-9, skewing every
// e^(z - lse) by ~2% at a 32k vocabulary) and f64 for f64 logits: cross_entropy_stats_dtype.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// Writes lse and loss_sum (0-d); returns the number of kept rows. A target outside
// [0, V) that is not ignore_index is an error naming the row, the value and V.
HAM_DECLARE_KERNEL_TABLE(cross_entropy,
                         int64_t(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index, Tensor& lse, Tensor& loss_sum));
// dloss is the 0-d gradient of loss_sum.
HAM_DECLARE_KERNEL_TABLE(cross_entropy_backward,
                         void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, const Tensor& dloss, double scale,
                              Tensor& dlogits));

// The forward and the backward of a block of rows in one call, for the chunks of
// ops::linear_cross_entropy: logits are overwritten by their gradient
//   dlogits_rj = (e^(logits_rj - lse_r) - [j == target_r]) * scale   (0 on ignored rows)
// loss_sum (0-d, stats dtype) gets the rows' loss, and `tally` (i64 [2], on the logits'
// device) accumulates [0] += the kept rows and [1] = min([1], row_offset + r) over rows r
// whose target is out of range (their gradient rows are 0; the caller reports the error).
// Nothing is read back to the host, so the caller's chunks queue without waiting.
HAM_DECLARE_KERNEL_TABLE(cross_entropy_with_grad,
                         void(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              double scale, int64_t row_offset, Tensor& loss_sum,
                              Tensor& tally));

// The dtype of lse, the loss and its gradient for logits of `logits` dtype.
inline DType cross_entropy_stats_dtype(DType logits) {
  return logits == DType::F64 ? DType::F64 : DType::F32;
}

namespace ops {

struct CrossEntropyResult {
  Tensor loss_sum;    // 0-d, cross_entropy_stats_dtype
  Tensor lse;         // [rows], cross_entropy_stats_dtype
  int64_t count = 0;  // rows whose target is not ignore_index
};

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, const Tensor& dloss, double scale);

}  // namespace ops

namespace cpu {
int64_t cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                      Tensor& lse, Tensor& loss_sum);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            int64_t ignore_index, const Tensor& dloss, double scale,
                            Tensor& dlogits);
void cross_entropy_with_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             double scale, int64_t row_offset, Tensor& loss_sum, Tensor& tally);
}  // namespace cpu

}  // namespace ham
