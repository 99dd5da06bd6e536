#include "core/ops/cross_entropy.h"

#include <algorithm>
#include <cstdint>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(cross_entropy, &cpu::cross_entropy,
                        int64_t(const Tensor& logits, const Tensor& targets,
                                int64_t ignore_index, Tensor& lse, Tensor& loss_sum))
HAM_DEFINE_KERNEL_TABLE(cross_entropy_backward, &cpu::cross_entropy_backward,
                        void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             int64_t ignore_index, const Tensor& dloss, double scale,
                             Tensor& dlogits))
HAM_DEFINE_KERNEL_TABLE(cross_entropy_with_grad, &cpu::cross_entropy_with_grad,
                        void(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             double scale, int64_t row_offset, Tensor& loss_sum,
                             Tensor& tally))

namespace ops {

namespace {

// logits [..., V] and targets [...]: the same leading dims.
void check_inputs(const Tensor& logits, const Tensor& targets) {
  HAM_CHECK(logits.defined() && targets.defined(),
            "cross_entropy: logits and targets must be defined tensors");
  const Shape& ls = logits.shape();
  bool shapes_match = logits.dim() >= 2 && targets.dim() == logits.dim() - 1 &&
                      std::equal(targets.shape().begin(), targets.shape().end(), ls.begin());
  HAM_CHECK(shapes_match, "cross_entropy: logits ", shape_str(ls), " and targets ",
            shape_str(targets.shape()), " do not match (expected logits [N, V], targets [N])");
  HAM_CHECK(is_floating(logits.dtype()), "cross_entropy: logits must be floating point, got ",
            logits.str(), " (targets ", targets.str(), ")");
  HAM_CHECK(targets.dtype() == DType::I32 || targets.dtype() == DType::I64,
            "cross_entropy: targets must be i32 or i64, got ", targets.str(), " (logits ",
            logits.str(), ")");
  check_same_device("cross_entropy", logits, targets);
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index) {
  check_inputs(logits, targets);
  CrossEntropyResult r;
  const DType stats = cross_entropy_stats_dtype(logits.dtype());
  r.lse = Tensor::empty({targets.numel()}, stats, logits.device());
  r.loss_sum = Tensor::empty({}, stats, logits.device());
  r.count = cross_entropy_kernels()(logits.device(), logits, targets, ignore_index, r.lse,
                                    r.loss_sum);
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, const Tensor& dloss, double scale) {
  const DType stats = cross_entropy_stats_dtype(logits.dtype());
  HAM_CHECK(dloss.numel() == 1 && dloss.dtype() == stats, "cross_entropy backward: gradient ",
            dloss.str(), " must be one ", dtype_name(stats), " value (logits ", logits.str(), ")");
  HAM_CHECK(lse.numel() == targets.numel() && lse.dtype() == stats,
            "cross_entropy backward: lse ", lse.str(), " must be ", dtype_name(stats), "[",
            targets.numel(), "] (logits ", logits.str(), ")");
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  cross_entropy_backward_kernels()(logits.device(), logits, targets, lse, ignore_index, dloss,
                                   scale, dlogits);
  return dlogits;
}

}  // namespace ops
}  // namespace ham
