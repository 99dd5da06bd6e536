#pragma once
// Routed attention at decoding time: a few new queries per sequence attend over a KV cache
// that holds, in order of position, the tokens selected so far (HAM's sparse cache, or
// every token for Transformer and GSA layers). The math is routed_attention's
// (core/ops/routed_attention.h) with the compaction already done by the cache:
//
//   q [B, n, Hq, Dk]             the new tokens' queries (n small: usually 1)
//   k_cache [B, C, Hkv, Dk]      cached keys, C the cache's capacity
//   v_cache [B, C, Hkv, Dv]      cached values
//   value_scale [B, C]           optional: v'_j = p_j v_j (the learned router's scores)
//   visible [B, n] i64, on the CPU: query i of row b sees cached tokens [0, visible[b, i]),
//                                0 <= visible <= C (entries past it are never read)
//
//   s_j        = scale <q[b,i,h], k_cache[b,j,g]>      g = h / (Hq / Hkv), j < visible[b,i]
//   lse[b,i,h] = log sum_j exp(s_j)                    (-inf when visible[b,i] = 0)
//   o[b,i,h]   = sum_j exp(s_j - lse) v'_j             (0 when visible[b,i] = 0)
//
// This is what routed_attention_forward gives for the same keys in a packed sequence, at
// a cost proportional to the visible keys: no [C, C] query tiles, no compaction pass.
// Inference only: there is no backward.
//
// Kernels: the CPU reference (core/cpu/routed_attention_decode.cpp) and flash-decoding on
// CUDA (cuda/routed_attention_decode.cu: the visible keys split across blocks, partial
// results merged in a fixed order).
#include <cstdint>

#include "core/dispatch.h"
#include "core/ops/routed_attention.h"
#include "core/tensor.h"

namespace ham {

// value_scale may be undefined; visible is an i64 CPU tensor, checked by the caller.
// Writes out [B, n, Hq, Dv] and lse [B, n, Hq] (f32; f64 for f64 inputs).
HAM_DECLARE_KERNEL_TABLE(routed_attention_decode,
                         void(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& value_scale, const Tensor& visible, double scale,
                              Tensor& out, Tensor& lse));

namespace ops {

// Throws a one-line "routed_attention_decode: ..." error naming the argument and shapes
// (or the out-of-range entry of visible) unless the arguments fit the shapes above.
// scale = 0 means 1/sqrt(Dk).
RoutedAttentionOutput routed_attention_decode(const Tensor& q, const Tensor& k_cache,
                                              const Tensor& v_cache, const Tensor& visible,
                                              const Tensor& value_scale = Tensor(),
                                              double scale = 0.0);

}  // namespace ops

namespace cpu {
void routed_attention_decode(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& value_scale, const Tensor& visible, double scale,
                             Tensor& out, Tensor& lse);
}  // namespace cpu

}  // namespace ham
