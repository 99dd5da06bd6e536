#include "core/ops/routed_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(compact_selection, &cpu::compact_selection,
                        void(const Tensor& select, const Tensor& doc_ids, CompactSelection& out))
HAM_DEFINE_KERNEL_TABLE(routed_attention_forward, &cpu::routed_attention_forward,
                        void(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& value_scale, const CompactSelection& selection,
                             double scale, Tensor& out, Tensor& lse))
HAM_DEFINE_KERNEL_TABLE(routed_attention_backward, &cpu::routed_attention_backward,
                        void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& value_scale, const CompactSelection& selection,
                             const Tensor& out, const Tensor& lse, double scale, Tensor& dq,
                             Tensor& dk, Tensor& dv, Tensor& dvalue_scale))

namespace ops {

namespace {

constexpr const char* kOp = "routed_attention";

std::string shape_of(const Tensor& t) { return shape_str(t.shape()); }

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  HAM_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": q, k and v must be defined tensors");
  HAM_CHECK(q.dim() == 4, kOp, ": q ", shape_of(q), " must be [B, T, Hq, Dk]");
  HAM_CHECK(k.dim() == 4, kOp, ": k ", shape_of(k), " must be [B, T, Hkv, Dk]");
  HAM_CHECK(v.dim() == 4, kOp, ": v ", shape_of(v), " must be [B, T, Hkv, Dv]");
  HAM_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), kOp, ": k ",
            shape_of(k), " must have the same B, T, Dk as q ", shape_of(q));
  HAM_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2), kOp, ": v ",
            shape_of(v), " must have the same B, T, heads as k ", shape_of(k));
  HAM_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, kOp, ": q heads (", q.size(2),
            ") must be a multiple of k heads (", k.size(2), "), q ", shape_of(q), " k ",
            shape_of(k));
  HAM_CHECK(q.size(3) > 0 && v.size(3) > 0, kOp, ": head dims must be positive, q ", shape_of(q),
            " v ", shape_of(v));
  HAM_CHECK(is_floating(q.dtype()), kOp, ": q must be a floating-point tensor, got ", q.str());
  HAM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp,
            ": q, k and v must share one dtype, got ", q.str(), ", ", k.str(), ", ", v.str());
  check_same_device(kOp, q, k);
  check_same_device(kOp, q, v);
}

// A [B, T] per-token tensor next to q [B, T, Hq, Dk].
void check_per_token(const char* arg, const Tensor& t, const Tensor& q) {
  HAM_CHECK(t.shape() == Shape({q.size(0), q.size(1)}), kOp, ": ", arg, " ", shape_of(t),
            " must be [B, T] = [", q.size(0), ", ", q.size(1), "] of q ", shape_of(q));
  check_same_device(kOp, t, q);
}

void check_select_dtype(const Tensor& select) {
  HAM_CHECK(select.defined(), kOp, ": select must be a defined u8 [B, T] tensor");
  HAM_CHECK(select.dtype() == DType::U8, kOp, ": select must be u8 (nonzero = selected), got ",
            select.str(), "; build the mask as u8 0/1 values");
}

void check_doc_ids_dtype(const Tensor& doc_ids) {
  HAM_CHECK(doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64, kOp,
            ": doc_ids must be i32 or i64, got ", doc_ids.str());
}

void check_value_scale(const Tensor& value_scale, const Tensor& q) {
  if (!value_scale.defined()) return;
  HAM_CHECK(value_scale.dtype() == q.dtype(), kOp, ": value_scale ", value_scale.str(),
            " must have q's dtype ", dtype_name(q.dtype()));
  check_per_token("value_scale", value_scale, q);
}

void check_selection_matches(const CompactSelection& selection, const Tensor& q) {
  HAM_CHECK(selection.key_positions.defined() && selection.key_counts.defined() &&
                selection.visible_begin.defined() && selection.visible_end.defined(),
            kOp, ": the selection is incomplete (build it with ops::compact_selection)");
  check_per_token("selection.key_positions", selection.key_positions, q);
  check_per_token("selection.visible_begin", selection.visible_begin, q);
  check_per_token("selection.visible_end", selection.visible_end, q);
  HAM_CHECK(selection.key_counts.shape() == Shape({q.size(0)}), kOp, ": selection.key_counts ",
            shape_of(selection.key_counts), " must be [B] = [", q.size(0), "]");
  check_same_device(kOp, selection.key_counts, q);
}

// The log-sum-exp is kept in f32 (f64 for f64 inputs), whatever the inputs' storage type.
DType lse_dtype(DType input) { return input == DType::F64 ? DType::F64 : DType::F32; }

// The CUDA forward takes each row's running max over the unscaled scores, which is the
// max of the scaled ones only for a positive scale.
void check_scale(double scale) {
  HAM_CHECK(std::isfinite(scale) && scale >= 0.0, kOp,
            ": scale must be finite and positive (0: 1/sqrt(Dk)), got ", scale);
}

}  // namespace

double routed_attention_scale(double scale, int64_t head_dim) {
  return scale == 0.0 ? 1.0 / std::sqrt(double(head_dim)) : scale;
}

void check_routed_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& select, const Tensor& value_scale,
                                   const Tensor& doc_ids, double scale) {
  check_qkv(q, k, v);
  check_select_dtype(select);
  check_per_token("select", select, q);
  check_value_scale(value_scale, q);
  if (doc_ids.defined()) {
    check_doc_ids_dtype(doc_ids);
    check_per_token("doc_ids", doc_ids, q);
  }
  check_scale(scale);
}

CompactSelection compact_selection(const Tensor& select, const Tensor& doc_ids) {
  check_select_dtype(select);
  HAM_CHECK(select.dim() == 2, kOp, ": select ", shape_of(select), " must be [B, T]");
  if (doc_ids.defined()) {
    check_doc_ids_dtype(doc_ids);
    HAM_CHECK(doc_ids.shape() == select.shape(), kOp, ": doc_ids ", shape_of(doc_ids),
              " must match select ", shape_of(select), " ([B, T])");
    check_same_device(kOp, select, doc_ids);
  }
  const Shape& bt = select.shape();
  CompactSelection sel;
  sel.key_positions = Tensor::empty(bt, DType::I64, select.device());
  sel.key_counts = Tensor::empty({bt[0]}, DType::I64, select.device());
  sel.visible_begin = Tensor::empty(bt, DType::I64, select.device());
  sel.visible_end = Tensor::empty(bt, DType::I64, select.device());
  compact_selection_kernels()(select.device(), select, doc_ids, sel);
  if (select.device().is_cpu()) {
    std::vector<int64_t> counts = sel.key_counts.to_vector<int64_t>();
    sel.max_key_count = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  } else {
    sel.max_key_count = bt[1];  // an upper bound: reading the counts back would stall the stream
  }
  return sel;
}

RoutedAttentionOutput routed_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const CompactSelection& selection,
                                               const Tensor& value_scale, double scale) {
  check_qkv(q, k, v);
  check_value_scale(value_scale, q);
  check_selection_matches(selection, q);
  check_scale(scale);
  RoutedAttentionOutput r;
  r.out = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.dtype(), q.device());
  r.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, lse_dtype(q.dtype()), q.device());
  routed_attention_forward_kernels()(q.device(), q, k, v, value_scale, selection,
                                     routed_attention_scale(scale, q.size(3)), r.out, r.lse);
  return r;
}

RoutedAttentionGrads routed_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const CompactSelection& selection,
                                               const Tensor& out, const Tensor& lse,
                                               const Tensor& value_scale, double scale) {
  check_qkv(q, k, v);
  check_value_scale(value_scale, q);
  check_selection_matches(selection, q);
  check_scale(scale);
  const Shape out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  const Shape lse_shape{q.size(0), q.size(1), q.size(2)};
  for (const auto& [arg, t, shape, dtype] :
       {std::tuple{"dout", &dout, &out_shape, q.dtype()},
        std::tuple{"out", &out, &out_shape, q.dtype()},
        std::tuple{"lse", &lse, &lse_shape, lse_dtype(q.dtype())}}) {
    HAM_CHECK(t->defined() && t->shape() == *shape && t->dtype() == dtype, kOp, " backward: ", arg,
              " ", t->defined() ? t->str() : "undefined", " must be ", dtype_name(dtype),
              shape_str(*shape));
    check_same_device(kOp, *t, q);
  }
  RoutedAttentionGrads g;
  g.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  g.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  g.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (value_scale.defined()) {
    g.dvalue_scale = Tensor::empty(value_scale.shape(), value_scale.dtype(), value_scale.device());
  }
  routed_attention_backward_kernels()(q.device(), dout, q, k, v, value_scale, selection, out, lse,
                                      routed_attention_scale(scale, q.size(3)), g.dq, g.dk, g.dv,
                                      g.dvalue_scale);
  return g;
}

Tensor masked_attention_naive(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& select, const Tensor& value_scale,
                              const Tensor& doc_ids, double scale) {
  check_routed_attention_inputs(q, k, v, select, value_scale, doc_ids, scale);
  const Device cpu_device = Device::cpu();
  auto on_cpu = [&](const Tensor& t) { return t.defined() ? t.to(cpu_device) : t; };
  Tensor out = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.dtype(), cpu_device);
  cpu::masked_attention_naive(on_cpu(q), on_cpu(k), on_cpu(v), on_cpu(select), on_cpu(value_scale),
                              on_cpu(doc_ids), routed_attention_scale(scale, q.size(3)), out);
  return out.to(q.device());
}

RoutedAttentionScoreCounts routed_attention_last_score_counts() {
  return cpu::routed_attention_last_score_counts();
}

}  // namespace ops
}  // namespace ham
