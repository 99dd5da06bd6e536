#include "core/ops/linear_cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <vector>

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

int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t vocab, int64_t dim,
                                        int64_t chunk_rows, Device device) {
  if (chunk_rows > 0) return std::max<int64_t>(1, std::min(rows, chunk_rows));
  const int64_t elements =
      device.is_cuda() ? std::max(kLinearCrossEntropyChunkElementsCuda, vocab * dim)
                       : kLinearCrossEntropyChunkElementsCpu;
  const int64_t most = std::max<int64_t>(1, elements / std::max<int64_t>(vocab, 1));
  if (rows <= most) return std::max<int64_t>(rows, 1);
  const int64_t chunks = (rows + most - 1) / most;
  const int64_t even = (rows + chunks - 1) / chunks;  // <= most
  const int64_t rounded = (even + 63) / 64 * 64;
  return rounded <= most ? rounded : even;
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
  const bool with_grad = with_grad_hidden || with_grad_weight;
  Tensor dh, dw_sum;
  if (with_grad_hidden) {
    r.grad_hidden = Tensor::empty(hidden.shape(), dtype, device);
    dh = r.grad_hidden.reshape({rows, dim});
  }
  if (with_grad_weight) {  // the first chunk's GEMM writes it (beta = 0)
    dw_sum = rows > 0 ? Tensor::empty({vocab, dim}, stats, device)
                      : Tensor::zeros({vocab, dim}, stats, device);
  }
  auto finish = [&] {
    if (with_grad_weight) r.grad_weight = ops::cast(dw_sum, dtype);
    return r;
  };
  if (rows == 0) return finish();

  const int64_t chunk = linear_cross_entropy_chunk_rows(rows, vocab, dim, chunk_rows, device);
  Tensor logits_buffer = Tensor::empty({chunk, vocab}, dtype, device);
  Tensor chunk_loss = Tensor::empty({}, stats, device);

  if (!with_grad) {  // the loss alone: each chunk's forward kernel returns its kept rows
    Tensor lse_buffer = Tensor::empty({chunk}, stats, device);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t r1 = std::min(rows, r0 + chunk);
      Tensor z = logits_buffer.slice(0, r1 - r0);
      Tensor lse = lse_buffer.slice(0, r1 - r0);
      gemm(h.slice(r0, r1), weight, z, false, true);  // z = h_c W^T
      try {
        r.count += cross_entropy_kernels()(device, z, t.slice(r0, r1), ignore_index, lse,
                                           chunk_loss);
      } catch (const Error& e) {
        HAM_FAIL("linear_cross_entropy: in the chunk of rows [", r0, ", ", r1, ") of ", rows,
                 " (chunk row i is row ", r0, " + i): ", e.what());
      }
      axpy_(1.0, chunk_loss, r.loss_sum);
    }
    return finish();
  }

  // With gradients nothing waits for the device until after the last chunk: the kept rows
  // and the first bad row gather in `tally` on the device.
  Tensor tally = Tensor::from_vector<int64_t>({0, rows}, {2}).to(device);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    const Tensor h_c = h.slice(r0, r1);
    Tensor z = logits_buffer.slice(0, r1 - r0);
    gemm(h_c, weight, z, false, true);  // z = h_c W^T
    // dz_c = softmax(z_c) - onehot over z_c, with the chunk's loss and counts.
    cross_entropy_with_grad_kernels()(device, z, t.slice(r0, r1), ignore_index, 1.0, r0,
                                      chunk_loss, tally);
    axpy_(1.0, chunk_loss, r.loss_sum);
    if (with_grad_hidden) {
      Tensor dh_c = dh.slice(r0, r1);
      gemm(z, weight, dh_c, false, false);  // dz_c W
    }
    if (with_grad_weight) {  // dW += dz_c^T h_c
      gemm(z, h_c, dw_sum, true, false, 1.0, r0 == 0 ? 0.0 : 1.0);
    }
  }
  const std::vector<int64_t> counts = tally.to(Device::cpu()).to_vector<int64_t>();
  if (const int64_t row = counts[1]; row < rows) {
    const int64_t r0 = row / chunk * chunk;
    const int64_t target = t.slice(row, row + 1).to_vector<int64_t>()[0];
    HAM_FAIL("linear_cross_entropy: in the chunk of rows [", r0, ", ", std::min(rows, r0 + chunk),
             ") of ", rows, " (chunk row i is row ", r0, " + i): cross_entropy: target ", target,
             " at row ", row - r0, " is out of range for V = ", vocab, " (ignore_index ",
             ignore_index, ")");
  }
  r.count = counts[0];
  return finish();
}

}  // namespace ham::ops
