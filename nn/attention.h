#pragma once
// Dense causal softmax attention, composed only of differentiable ops (permute,
// index_select, matmul, scale, add of a constant mask, softmax), so its gradient is
// autograd's and it can serve as the reference for fused kernels.
//   q [B, T, Hq, Dk], k [B, T, Hkv, Dk], v [B, T, Hkv, Dv], Hq a multiple of Hkv
//   (query head h reads kv head h / (Hq / Hkv)); out [B, T, Hq, Dv]
//   out[b, t, h] = sum_s p[s] v[b, s, kvh],  p = softmax_s(scale * <q[b, t, h], k[b, s, kvh]>
//                                                         + mask[b, t, s])
// mask is 0 where s <= t (and, with doc_ids [B, T] i32/i64, doc_ids[b, s] == doc_ids[b, t]),
// -inf elsewhere. Every query sees at least itself, so no row is fully masked.
// Memory: one [B, Hq, T, T] score tensor (plus its softmax); fine for tests and short T.
#include "core/tensor.h"

namespace ham {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        const Tensor& doc_ids = Tensor());

// The additive mask above: [1, 1, T, T] without doc_ids, [B, 1, T, T] with them.
Tensor attention_mask(int64_t seq_len, const Tensor& doc_ids, DType dtype,
                      Device device = Device::cpu());

}  // namespace ham
