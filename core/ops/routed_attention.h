#pragma once
// Routed (sparse-KV) attention: every query attends, with softmax, over the *selected*
// tokens at or before it in its own document (HAM's KV path; with every token selected it
// is plain causal attention).
//
//   q [B, T, Hq, Dk], k [B, T, Hkv, Dk], v [B, T, Hkv, Dv], Hq a multiple of Hkv;
//   query head h reads kv head g = h / (Hq / Hkv) (grouped-query attention).
//   select [B, T] u8 (nonzero = selected, shared by all heads), value_scale p [B, T]
//   (optional, 1 when absent), doc_ids [B, T] i32/i64 (optional, one document when absent).
//
//   S(b,t)      = { i <= t : select[b,i] != 0 and doc[b,i] == doc[b,t] }
//   v'[b,i,g]   = p[b,i] v[b,i,g]                     (the learned router's gradient path)
//   s[t,i]      = scale <q[b,t,h], k[b,i,g]>           (scale > 0; 1/sqrt(Dk) when given 0)
//   lse[b,t,h]  = log sum_{i in S(b,t)} exp(s[t,i])    (-inf when S(b,t) is empty)
//   o[b,t,h]    = sum_{i in S(b,t)} exp(s[t,i] - lse) v'[b,i,g]   (0 when S(b,t) is empty)
//
// Compaction makes the cost T x T_KV instead of T x T. Per batch row the selected
// positions are listed grouped by document (documents in order of first appearance),
// ascending inside a document. Then S(b,t) is one contiguous range of that list: from
// the first selected key of t's document to its last selected key <= t. With the usual
// packed layout (each document one run of positions) the list is simply the selected
// positions in increasing order.
//
// Backward, with dO = dL/do and P recomputed from the saved lse (as flash-attention does):
//   P[t,i]  = exp(s[t,i] - lse_t)
//   D_t     = <dO_t, o_t>                          (= sum_i P[t,i] dP[t,i])
//   dP[t,i] = <dO_t, v'_i>
//   dS[t,i] = P[t,i] (dP[t,i] - D_t)               (softmax backward)
//   dq_t    = scale sum_i dS[t,i] k_i
//   dk_i    = scale sum_t dS[t,i] q_t              (t over queries of every head of i's group)
//   dv'_i   = sum_t P[t,i] dO_t                    (likewise)
//   dv_i    = p_i dv'_i,     dp_i = sum_g <dv'_{i,g}, v_{i,g}>   (since v' = p v)
// Unselected keys get exactly zero dk, dv and dp; queries with no visible key get dq = 0.
// select and doc_ids get no gradient.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// The compacted key lists of one batch (all i64, on select's device).
struct CompactSelection {
  // [B, T]: key_positions[b, 0 : key_counts[b]) are row b's selected positions, grouped by
  // document and ascending inside one; the entries past key_counts[b] are -1.
  Tensor key_positions;
  Tensor key_counts;  // [B]
  // [B, T]: query t sees the compacted keys [visible_begin, visible_end) of its row.
  Tensor visible_begin, visible_end;
  // Sizes the CPU kernels' buffers: the max over rows of key_counts on the CPU; on a GPU,
  // whose kernels need no such bound, T (an upper bound), so building a selection never
  // copies the counts back to the host.
  int64_t max_key_count = 0;
};

HAM_DECLARE_KERNEL_TABLE(compact_selection,
                         void(const Tensor& select, const Tensor& doc_ids, CompactSelection& out));
// value_scale may be undefined. Writes out [B, T, Hq, Dv] and lse [B, T, Hq].
HAM_DECLARE_KERNEL_TABLE(routed_attention_forward,
                         void(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& value_scale, const CompactSelection& selection,
                              double scale, Tensor& out, Tensor& lse));
// dvalue_scale is undefined exactly when value_scale is.
HAM_DECLARE_KERNEL_TABLE(routed_attention_backward,
                         void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& value_scale, const CompactSelection& selection,
                              const Tensor& out, const Tensor& lse, double scale, Tensor& dq,
                              Tensor& dk, Tensor& dv, Tensor& dvalue_scale));

namespace ops {

struct RoutedAttentionOutput {
  Tensor out;  // [B, T, Hq, Dv], q's dtype
  Tensor lse;  // [B, T, Hq]: f64 for f64 inputs, else f32 (bf16 too); -inf for empty rows
};

struct RoutedAttentionGrads {
  Tensor dq, dk, dv;
  Tensor dvalue_scale;  // undefined without value_scale
};

// The softmax scale actually used: 1/sqrt(head_dim) when `scale` is 0.
double routed_attention_scale(double scale, int64_t head_dim);

// Throws a one-line "routed_attention: ..." error naming the argument and shapes unless
// the arguments fit the shapes and dtypes above (value_scale and doc_ids may be undefined).
void check_routed_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& select, const Tensor& value_scale,
                                   const Tensor& doc_ids, double scale);

CompactSelection compact_selection(const Tensor& select, const Tensor& doc_ids = Tensor());

RoutedAttentionOutput routed_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const CompactSelection& selection,
                                               const Tensor& value_scale = Tensor(),
                                               double scale = 0.0);

// `out` and `lse` are the forward's results for the same inputs.
RoutedAttentionGrads routed_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const CompactSelection& selection,
                                               const Tensor& out, const Tensor& lse,
                                               const Tensor& value_scale = Tensor(),
                                               double scale = 0.0);

// Test reference: the same o from the full [T, T] mask and plain loops (no compaction,
// O(T^2) per head). Runs on the CPU; returns the output on q's device.
Tensor masked_attention_naive(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& select, const Tensor& value_scale = Tensor(),
                              const Tensor& doc_ids = Tensor(), double scale = 0.0);

// The CPU kernels take the queries of one (batch row, head) in tiles of this many, and
// split a tile into segments: runs of consecutive queries with the same first visible key
// (one document's). A segment is scored against every key any of its queries sees, as one
// matrix product, and the keys past each query's own last one are masked.
constexpr int64_t kRoutedAttentionCpuQueryTile = 64;

// Debug counters of the CPU kernels for the last forward and the last backward. Meaningless
// while several run at once.
struct RoutedAttentionScoreCounts {
  // Scores s[t,i] that enter a softmax, one per query, visible key and query head:
  // Hq * sum_{b,t} |S(b,t)| (with compaction, not Hq * T (T + 1) / 2).
  int64_t forward = 0, backward = 0;
  // Scores computed, the masked ones of each segment's rectangle included:
  // Hq * sum over segments of (queries x keys its queries see together).
  int64_t forward_computed = 0, backward_computed = 0;
};
RoutedAttentionScoreCounts routed_attention_last_score_counts();

}  // namespace ops

namespace cpu {
void compact_selection(const Tensor& select, const Tensor& doc_ids, CompactSelection& out);
void routed_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& value_scale, const CompactSelection& selection,
                              double scale, Tensor& out, Tensor& lse);
void routed_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& value_scale,
                               const CompactSelection& selection, const Tensor& out,
                               const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                               Tensor& dvalue_scale);
void masked_attention_naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& select,
                            const Tensor& value_scale, const Tensor& doc_ids, double scale,
                            Tensor& out);
ops::RoutedAttentionScoreCounts routed_attention_last_score_counts();
}  // namespace cpu

}  // namespace ham
