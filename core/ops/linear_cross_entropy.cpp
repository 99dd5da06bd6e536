#include "core/ops/linear_cross_entropy.h"

#include <algorithm>
#include <cstdint>

#include "core/ops/cast.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"

namespace ham::ops {

namespace {

// hidden [..., D], weight [V, D], targets [...] (hidden's leading dims).
void check_inputs(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                  int64_t chunk_rows) {
  HAM_CHECK(hidden.defined() && weight.defined() && targets.defined(),
            "linear_cross_entropy: hidden, weight and targets must be defined tensors");
  const Shape& hs = hidden.shape();
  const bool shapes_match =
      hidden.dim() >= 2 && weight.dim() == 2 && weight.size(1) == hidden.size(-1) &&
      weight.size(0) >= 1 && targets.dim() == hidden.dim() - 1 &&
      std::equal(targets.shape().begin(), targets.shape().end(), hs.begin());
  HAM_CHECK(shapes_match, "linear_cross_entropy: hidden ", shape_str(hs), ", weight ",
            shape_str(weight.shape()), " and targets ", shape_str(targets.shape()),
            " do not match (expected hidden [N, D], weight [V, D] with V >= 1, targets [N])");
  HAM_CHECK(is_floating(hidden.dtype()) && weight.dtype() == hidden.dtype(),
            "linear_cross_entropy: hidden and weight must have one floating dtype, got hidden ",
            hidden.str(), " and weight ", weight.str());
  HAM_CHECK(targets.dtype() == DType::I32 || targets.dtype() == DType::I64,
            "linear_cross_entropy: targets must be i32 or i64, got ", targets.str(), " (hidden ",
            hidden.str(), ", weight ", weight.str(), ")");
  HAM_CHECK(weight.device() == hidden.device() && targets.device() == hidden.device(),
            "linear_cross_entropy: hidden ", hidden.str(), ", weight ", weight.str(),
            " and targets ", targets.str(), " must be on one device");
  HAM_CHECK(chunk_rows >= 0, "linear_cross_entropy: chunk_rows must be >= 0 (0 = default), got ",
            chunk_rows, " (hidden ", shape_str(hs), ", weight ", shape_str(weight.shape()), ")");
}

}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t vocab, int64_t chunk_rows,
                                        Device device) {
  if (chunk_rows <= 0) {
    const int64_t elements = device.is_cuda() ? kLinearCrossEntropyChunkElementsCuda
                                              : kLinearCrossEntropyChunkElementsCpu;
    chunk_rows = elements / std::max<int64_t>(vocab, 1);
  }
  return std::max<int64_t>(1, std::min(rows, chunk_rows));
}

LinearCrossEntropyResult linear_cross_entropy(const Tensor& hidden, const Tensor& weight,
                                              const Tensor& targets, int64_t ignore_index,
                                              int64_t chunk_rows, bool with_grad_hidden,
                                              bool with_grad_weight) {
  check_inputs(hidden, weight, targets, chunk_rows);
  const int64_t rows = targets.numel(), dim = hidden.size(-1), vocab = weight.size(0);
  const DType dtype = hidden.dtype();
  const Device device = hidden.device();
  const Tensor h = hidden.reshape({rows, dim});  // views
  const Tensor t = targets.reshape({rows});

  // The loss, lse and (for bf16) the dW accumulator are kept in f32 (f64 for f64).
  const DType stats = cross_entropy_stats_dtype(dtype);
  LinearCrossEntropyResult r;
  r.loss_sum = Tensor::zeros({}, stats, device);
  Tensor dh, dw_sum;
  if (with_grad_hidden) {
    r.grad_hidden = Tensor::empty(hidden.shape(), dtype, device);
    dh = r.grad_hidden.reshape({rows, dim});
  }
  if (with_grad_weight) dw_sum = Tensor::zeros({vocab, dim}, stats, device);
  auto finish = [&] {
    if (with_grad_weight) r.grad_weight = ops::cast(dw_sum, dtype);
    return r;
  };
  if (rows == 0) return finish();
  const bool with_grad = with_grad_hidden || with_grad_weight;

  const int64_t chunk = linear_cross_entropy_chunk_rows(rows, vocab, chunk_rows, device);
  Tensor logits_buffer = Tensor::empty({chunk, vocab}, dtype, device);
  Tensor lse_buffer = Tensor::empty({chunk}, stats, device);
  Tensor chunk_loss = Tensor::empty({}, stats, device);
  const Tensor one = with_grad ? Tensor::scalar(1.0, stats, device) : Tensor();

  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    const Tensor h_c = h.slice(r0, r1), t_c = t.slice(r0, r1);
    Tensor z = logits_buffer.slice(0, r1 - r0);
    Tensor lse = lse_buffer.slice(0, r1 - r0);
    gemm(h_c, weight, z, false, true);  // z = h_c W^T
    int64_t kept = 0;
    try {
      kept = cross_entropy_kernels()(device, z, t_c, ignore_index, lse, chunk_loss);
    } catch (const Error& e) {
      HAM_FAIL("linear_cross_entropy: in the chunk of rows [", r0, ", ", r1, ") of ", rows,
               " (chunk row i is row ", r0, " + i): ", e.what());
    }
    r.count += kept;
    axpy_(1.0, chunk_loss, r.loss_sum);
    if (!with_grad) continue;
    Tensor dh_c = with_grad_hidden ? dh.slice(r0, r1) : Tensor();
    if (kept == 0) {  // every row ignored: dz_c = 0
      if (with_grad_hidden) dh_c.zero_();
      continue;
    }
    // dz_c = softmax(z_c) - onehot, written over z_c (each element read before it is written).
    cross_entropy_backward_kernels()(device, z, t_c, lse, ignore_index, one, 1.0, z);
    if (with_grad_hidden) gemm(z, weight, dh_c, false, false);                  // dz_c W
    if (with_grad_weight) gemm(z, h_c, dw_sum, true, false, 1.0, 1.0);  // += dz_c^T h_c
  }
  return finish();
}

}  // namespace ham::ops
