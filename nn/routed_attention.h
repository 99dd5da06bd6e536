#pragma once
// Routed (sparse-KV) attention, HAM's KV path: every query attends, with softmax, over the
// selected tokens at or before it in its own document. One autograd node, hand-derived
// backward (the math is in core/ops/routed_attention.h).
//
//   o[b,t,h] = sum_{i in S(b,t)} softmax_i(scale * q[b,t,h] . k[b,i,kvh]) * (p[b,i] * v[b,i,kvh])
//   S(b,t)   = { i <= t : select[b,i] != 0 and doc[b,i] == doc[b,t] };  o = 0 when S(b,t) is empty
//
// q [B, T, Hq, Dk], k [B, T, Hkv, Dk], v [B, T, Hkv, Dv] with Hq a multiple of Hkv (query
// head h reads kv head h / (Hq / Hkv)); select [B, T] u8, shared by all heads;
// value_scale p [B, T] (q's dtype; optional, the learned router's gradient path:
// dv = p dv', dp_i = sum over kv heads <dv'_i, v_i>); doc_ids [B, T] i32/i64 (optional);
// scale 0 means 1/sqrt(Dk). Output [B, T, Hq, Dv]. Gradients flow to q, k, v and
// value_scale; none to select or doc_ids. Cost is proportional to T x (selected keys).
#include "core/tensor.h"

namespace ham {

Tensor routed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& select,
                        const Tensor& value_scale = Tensor(), const Tensor& doc_ids = Tensor(),
                        double scale = 0.0);

}  // namespace ham
