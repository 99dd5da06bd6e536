#pragma once
// Fused linear cross-entropy: an LM head (no bias) followed by softmax cross-entropy,
// without ever holding the whole [N, V] logits. hidden h [N, D], weight W [V, D],
// integer targets t [N] (i32/i64); rows whose target is ignore_index take no part.
//   z_r    = h_r W^T                                        (logits of row r, [V])
//   loss   = sum over kept rows r of (logsumexp(z_r) - z_r[t_r])
//   dz_r   = softmax(z_r) - onehot(t_r)                      (0 on ignored rows)
//   dh     = dz W,   dW = dz^T h                             (gradients of the summed loss)
// The rows are walked in chunks of c rows; per chunk (h_c = rows [r0, r0 + c) of h):
//   z_c  = h_c W^T                        GEMM into one reused [c, V] buffer
//   and for the loss alone:
//   lse_c, loss_c, kept_c                 the cross_entropy kernel; loss += loss_c
//   or, when gradients are asked for:
//   loss_c, dz_c = softmax(z_c) - onehot  the cross_entropy_with_grad kernel, over z_c in
//                                         place (one kernel: the logits are read once)
//   dh_c = dz_c W                         GEMM into rows [r0, r0 + c) of dh
//   dW  += dz_c^T h_c                     GEMM accumulating into dW (the first chunk's
//                                         with beta = 0: no zero fill)
// so 1 GEMM per chunk for the loss alone, 3 with both gradients (as Liger-Kernel's fused
// linear cross-entropy). Extra memory beyond the inputs and the gradients: the c x V
// logits buffer (and c log-sum-exps for the loss alone). The default c splits the N rows
// evenly into the fewest chunks of at most E / V rows (rounded up to a multiple of 64 for
// the GEMM tiles where that stays within E / V), E = 2^23 logits on the CPU (32 MiB in
// f32) and max(2^28, V D) on CUDA (see below). The chunks run one after another with
// device-dispatched kernels (ops::gemm, cross_entropy, cross_entropy_with_grad), so the
// op runs on every device that has those; it has no kernel table of its own. The loss and
// the log-sum-exps are f32 for f32 and bf16 inputs (f64 for f64), and dW accumulates over
// the chunks in f32 (bf16 products into an f32 GEMM output), rounded to bf16 once at the
// end.
//
// With gradients the chunks never wait for the device: the kept rows and the first bad
// target gather on the device and are read once, after the last chunk. The loss alone
// reads each chunk's kept count back (one wait per chunk).
#include <cstdint>

#include "core/tensor.h"

namespace ham::ops {

// Logits per chunk of the default chunk size. CPU: 2^23 (32 MiB in f32), near the caches.
// CUDA: 2^28 (1 GiB in f32, 512 MiB in bf16), or V D where larger: on an H200 the three
// GEMMs per chunk need thousands of rows to run at full rate (65-row chunks of a 128K
// vocabulary ran 7 times slower than 4096-row ones), and each chunk's dW GEMM reads and
// writes the f32 [V, D] accumulator (at N 8192, D 4096, V 128256: 2 chunks of 4096 rows
// took 41.2 ms, 4 of 2092 42.5 ms), while a chunk of V D bf16 logits is half that
// accumulator's size.
inline constexpr int64_t kLinearCrossEntropyChunkElementsCpu = int64_t(1) << 23;
inline constexpr int64_t kLinearCrossEntropyChunkElementsCuda = int64_t(1) << 28;

// The chunk size used for `rows` rows of `dim` features and a vocabulary of `vocab` on
// `device`: `chunk_rows` clamped to [1, rows] when positive; when 0, the even split above.
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t vocab, int64_t dim,
                                        int64_t chunk_rows = 0, Device device = Device::cpu());

struct LinearCrossEntropyResult {
  Tensor loss_sum;      // 0-d, f32 (f64 for f64 inputs): sum over kept rows
  int64_t count = 0;    // rows whose target is not ignore_index
  Tensor grad_hidden;   // d loss_sum / d hidden, hidden's shape (when asked for)
  Tensor grad_weight;   // d loss_sum / d weight, [V, D] (when asked for)
};

// hidden [N, D] ([..., D] with targets [...] also works), weight [V, D] of hidden's
// floating dtype, targets [N] i32/i64, all on one device. chunk_rows 0 = the default
// above. with_grad_hidden / with_grad_weight: also compute that gradient of loss_sum
// (2 more GEMMs per chunk for both, 1 for either). A target outside [0, V) that is not
// ignore_index is an error naming the chunk and the row in it.
LinearCrossEntropyResult linear_cross_entropy(const Tensor& hidden, const Tensor& weight,
                                              const Tensor& targets, int64_t ignore_index = -100,
                                              int64_t chunk_rows = 0,
                                              bool with_grad_hidden = false,
                                              bool with_grad_weight = false);

}  // namespace ham::ops
