#include "nn/attention.h"

#include <limits>
#include <vector>

#include "nn/elementwise.h"
#include "nn/matmul.h"
#include "nn/shape.h"
#include "nn/softmax.h"

namespace ham {

Tensor attention_mask(int64_t seq_len, const Tensor& doc_ids, DType dtype, Device device) {
  const double kMasked = -std::numeric_limits<double>::infinity();
  int64_t batch = 1;
  std::vector<int64_t> docs;
  if (doc_ids.defined()) {
    HAM_CHECK(doc_ids.dim() == 2 && doc_ids.size(1) == seq_len &&
                  (doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64),
              "attention_mask: doc_ids must be i32/i64 [B, ", seq_len, "], got ", doc_ids.str());
    batch = doc_ids.size(0);
    docs = doc_ids.to_vector<int64_t>();
  }
  std::vector<double> mask(size_t(batch * seq_len * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t s = 0; s < seq_len; ++s) {
        bool visible = s <= t;
        if (visible && !docs.empty()) {
          visible = docs[size_t(b * seq_len + s)] == docs[size_t(b * seq_len + t)];
        }
        mask[size_t((b * seq_len + t) * seq_len + s)] = visible ? 0.0 : kMasked;
      }
    }
  }
  return Tensor::from_vector(mask, {batch, 1, seq_len, seq_len}).to(dtype).to(device);
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double softmax_scale,
                        const Tensor& doc_ids) {
  bool ranks_ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4;
  HAM_CHECK(ranks_ok && k.shape() == Shape({q.size(0), q.size(1), k.size(2), q.size(3)}) &&
                v.shape() == Shape({q.size(0), q.size(1), k.size(2), v.size(3)}) &&
                k.size(2) > 0 && q.size(2) % k.size(2) == 0,
            "causal_attention: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
            shape_str(v.shape()),
            " must be [B, T, Hq, Dk], [B, T, Hkv, Dk], [B, T, Hkv, Dv] with Hq a multiple of Hkv");
  if (doc_ids.defined()) {
    HAM_CHECK(doc_ids.shape() == Shape({q.size(0), q.size(1)}), "causal_attention: doc_ids ",
              shape_str(doc_ids.shape()), " do not match q ", shape_str(q.shape()),
              " (expected [B, T])");
  }
  int64_t seq_len = q.size(1), q_heads = q.size(2), kv_heads = k.size(2);
  Tensor k_full = k, v_full = v;
  if (q_heads != kv_heads) {
    // Grouped-query heads: repeat each kv head for its group; the backward of
    // index_select sums the group's gradients back into the shared head.
    std::vector<int64_t> kv_of_head(static_cast<size_t>(q_heads));
    for (int64_t h = 0; h < q_heads; ++h) kv_of_head[size_t(h)] = h / (q_heads / kv_heads);
    Tensor index = Tensor::from_vector(kv_of_head, {q_heads}).to(q.device());
    k_full = index_select(k, 2, index);
    v_full = index_select(v, 2, index);
  }
  const std::vector<int64_t> heads_first = {0, 2, 1, 3};  // [B, T, H, D] <-> [B, H, T, D]
  Tensor qh = permute(q, heads_first);
  Tensor kh = permute(k_full, heads_first);
  Tensor vh = permute(v_full, heads_first);
  Tensor scores = scale(matmul(qh, kh, false, true), softmax_scale);  // [B, Hq, T, T]
  scores = add(scores, attention_mask(seq_len, doc_ids, q.dtype(), q.device()));
  Tensor out = matmul(softmax(scores), vh);  // [B, Hq, T, Dv]
  return permute(out, heads_first);
}

}  // namespace ham
