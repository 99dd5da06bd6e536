// CPU kernels of routed attention; the math is in core/ops/routed_attention.h.
//
// How the work is laid out:
//   compaction  one O(T) pass per batch row.
//   gather      each row's selected keys and scaled values v' = p v are copied into
//               contiguous [B, Hkv, N, D] buffers (N = most keys in any row), so a query
//               reads its visible keys as one contiguous block of rows.
//   forward     parallel over (b, query head, block of queries); per query a two-pass
//               softmax over exactly its visible keys (Eigen matrix-vector products).
//   backward    parallel over (b, query head); each task accumulates the dk, dv' of its
//               head in its own buffer, then one pass sums the heads of each kv group in a
//               fixed order (deterministic), applies the value scaling and scatters to the
//               original positions.
#include "core/ops/routed_attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "core/cpu/parallel.h"

namespace ham::cpu {

namespace {

template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
template <class T>
using MatrixMap = Eigen::Map<RowMajorMatrix<T>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix<T>>;
template <class T>
using VectorMap = Eigen::Map<Vector<T>>;
template <class T>
using ConstVectorMap = Eigen::Map<const Vector<T>>;

std::atomic<int64_t> g_forward_score_count{0};
std::atomic<int64_t> g_backward_score_count{0};

// Sizes shared by the forward and backward kernels.
struct Dims {
  int64_t batch, seq_len, q_heads, kv_heads, key_dim, value_dim;
  int64_t group_size;  // query heads per kv head
  int64_t max_keys;    // N: most selected keys in one row

  Dims(const Tensor& q, const Tensor& v, const CompactSelection& selection)
      : batch(q.size(0)),
        seq_len(q.size(1)),
        q_heads(q.size(2)),
        kv_heads(v.size(2)),
        key_dim(q.size(3)),
        value_dim(v.size(3)),
        group_size(q.size(2) / v.size(2)),
        max_keys(selection.max_key_count) {}

  int64_t kv_head_of(int64_t q_head) const { return q_head / group_size; }
  // Offsets of one token-head row in the [B, T, H, D] tensors.
  int64_t q_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq_len + t) * q_heads + h); }
  int64_t kv_row(int64_t b, int64_t i, int64_t g) const {
    return ((b * seq_len + i) * kv_heads + g);
  }
  // First compacted row of (b, kv head g) in the [B, Hkv, N, D] buffers.
  int64_t compact_row(int64_t b, int64_t g) const { return (b * kv_heads + g) * max_keys; }
};

// The selected keys and scaled values, compacted: row j of (b, g) holds k and p v of
// position key_positions[b, j].
template <class T>
struct CompactKeysValues {
  std::vector<T> keys, values;  // [B, Hkv, N, Dk], [B, Hkv, N, Dv]
};

template <class T>
CompactKeysValues<T> gather_selected(const Dims& d, const Tensor& k, const Tensor& v,
                                     const Tensor& value_scale, const CompactSelection& selection) {
  CompactKeysValues<T> kv;
  kv.keys.assign(size_t(d.batch * d.kv_heads * d.max_keys * d.key_dim), T(0));
  kv.values.assign(size_t(d.batch * d.kv_heads * d.max_keys * d.value_dim), T(0));
  const T* pk = k.data<T>();
  const T* pv = v.data<T>();
  const T* pp = value_scale.defined() ? value_scale.data<T>() : nullptr;
  const int64_t* positions = selection.key_positions.data<int64_t>();
  const int64_t* counts = selection.key_counts.data<int64_t>();
  parallel_for(d.batch * d.kv_heads, d.max_keys * (d.key_dim + d.value_dim), [&](int64_t task) {
    int64_t b = task / d.kv_heads, g = task % d.kv_heads;
    for (int64_t j = 0; j < counts[b]; ++j) {
      int64_t i = positions[b * d.seq_len + j];
      T p = pp ? pp[b * d.seq_len + i] : T(1);
      const T* k_src = pk + d.kv_row(b, i, g) * d.key_dim;
      const T* v_src = pv + d.kv_row(b, i, g) * d.value_dim;
      T* k_dst = kv.keys.data() + (d.compact_row(b, g) + j) * d.key_dim;
      T* v_dst = kv.values.data() + (d.compact_row(b, g) + j) * d.value_dim;
      std::copy(k_src, k_src + d.key_dim, k_dst);
      for (int64_t e = 0; e < d.value_dim; ++e) v_dst[e] = p * v_src[e];
    }
  });
  return kv;
}

// One (batch row, kv head)'s compacted keys [N, Dk] and scaled values [N, Dv].
template <class T>
struct KeyValueBlock {
  ConstMatrixMap<T> keys, values;

  KeyValueBlock(const CompactKeysValues<T>& kv, const Dims& d, int64_t b, int64_t g)
      : keys(kv.keys.data() + d.compact_row(b, g) * d.key_dim, d.max_keys, d.key_dim),
        values(kv.values.data() + d.compact_row(b, g) * d.value_dim, d.max_keys, d.value_dim) {}
};

// What the forward reads and writes, as raw row-major pointers.
template <class T>
struct ForwardBuffers {
  const T* q;
  T* out;
  T* lse;
  const int64_t *visible_begin, *visible_end;
  T scale;
};

constexpr int64_t kQueryBlock = 64;  // queries per forward task

// Forward of queries [t_first, t_last) of batch row b, query head h. Per query, over its
// visible compacted keys [lo, lo + n):
//   s_i = scale <q_t, k_i>,  e_i = exp(s_i - max s),  o_t = sum e_i v'_i / sum e_i,
//   lse_t = max s + log sum e_i.
// Returns the number of scores evaluated.
template <class T>
int64_t forward_query_block(const Dims& d, const ForwardBuffers<T>& f, const KeyValueBlock<T>& kv,
                            int64_t b, int64_t h, int64_t t_first, int64_t t_last) {
  Vector<T> scores(d.max_keys);
  int64_t scores_evaluated = 0;
  for (int64_t t = t_first; t < t_last; ++t) {
    const int64_t row = d.q_row(b, t, h);
    const int64_t lo = f.visible_begin[b * d.seq_len + t];
    const int64_t n = f.visible_end[b * d.seq_len + t] - lo;
    VectorMap<T> o(f.out + row * d.value_dim, d.value_dim);
    if (n == 0) {  // no visible key: o = 0 by definition, lse = log(0)
      o.setZero();
      f.lse[row] = -std::numeric_limits<T>::infinity();
      continue;
    }
    ConstVectorMap<T> q_t(f.q + row * d.key_dim, d.key_dim);
    auto s = scores.head(n);
    s.noalias() = kv.keys.middleRows(lo, n) * q_t;
    s *= f.scale;
    const T s_max = s.maxCoeff();
    s = (s.array() - s_max).exp();
    const T sum = s.sum();
    o.noalias() = kv.values.middleRows(lo, n).transpose() * s;
    o /= sum;
    f.lse[row] = s_max + std::log(sum);
    scores_evaluated += n;
  }
  return scores_evaluated;
}

// What the backward reads and writes, as raw row-major pointers.
template <class T>
struct BackwardBuffers {
  const T *q, *dout, *out, *lse;
  T* dq;
  const int64_t *visible_begin, *visible_end;
  T scale;
};

// Backward of every query of batch row b, query head h. Writes dq_t and accumulates this
// head's share of dk and dv' into head_dk [N, Dk] and head_dv [N, Dv] (compacted rows):
//   P_i = exp(scale <q_t, k_i> - lse_t),   dS_i = P_i (<dO_t, v'_i> - D_t),  D_t = <dO_t, o_t>
//   dq_t = scale sum_i dS_i k_i,   dk_i += scale dS_i q_t,   dv'_i += P_i dO_t
// Returns the number of scores evaluated.
template <class T>
int64_t backward_query_head(const Dims& d, const BackwardBuffers<T>& f, const KeyValueBlock<T>& kv,
                            int64_t b, int64_t h, MatrixMap<T> head_dk, MatrixMap<T> head_dv) {
  Vector<T> probs(d.max_keys), dscores(d.max_keys);
  int64_t scores_evaluated = 0;
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const int64_t row = d.q_row(b, t, h);
    const int64_t lo = f.visible_begin[b * d.seq_len + t];
    const int64_t n = f.visible_end[b * d.seq_len + t] - lo;
    VectorMap<T> dq_t(f.dq + row * d.key_dim, d.key_dim);
    if (n == 0) {  // o_t = 0 whatever q_t is, and no key sees this query
      dq_t.setZero();
      continue;
    }
    ConstVectorMap<T> q_t(f.q + row * d.key_dim, d.key_dim);
    ConstVectorMap<T> do_t(f.dout + row * d.value_dim, d.value_dim);
    ConstVectorMap<T> o_t(f.out + row * d.value_dim, d.value_dim);
    const T delta = do_t.dot(o_t);
    auto p = probs.head(n);
    auto ds = dscores.head(n);
    p.noalias() = kv.keys.middleRows(lo, n) * q_t;
    p = (p.array() * f.scale - f.lse[row]).exp();
    ds.noalias() = kv.values.middleRows(lo, n) * do_t;  // dP_i = <dO_t, v'_i>
    ds = p.cwiseProduct((ds.array() - delta).matrix());
    dq_t.noalias() = kv.keys.middleRows(lo, n).transpose() * ds;
    dq_t *= f.scale;
    head_dk.middleRows(lo, n).noalias() += (f.scale * ds) * q_t.transpose();
    head_dv.middleRows(lo, n).noalias() += p * do_t.transpose();
    scores_evaluated += n;
  }
  return scores_evaluated;
}

// For compacted key j of batch row b (original position i), sums the query heads of each
// kv group in a fixed order and scatters to position i:
//   dk_i = sum_h dk_{h,i},  dv'_i = sum_h dv'_{h,i},  dv_i = p_i dv'_i,
//   dp_i = sum_g <dv'_{i,g}, v_{i,g}>.
template <class T>
void scatter_key_gradients(const Dims& d, int64_t b, int64_t j, int64_t i,
                           const std::vector<T>& head_dk, const std::vector<T>& head_dv, const T* v,
                           const T* value_scale, T* dk, T* dv, T* dvalue_scale) {
  const T p = value_scale ? value_scale[b * d.seq_len + i] : T(1);
  T dp = T(0);
  for (int64_t g = 0; g < d.kv_heads; ++g) {
    VectorMap<T> dk_i(dk + d.kv_row(b, i, g) * d.key_dim, d.key_dim);
    VectorMap<T> dv_i(dv + d.kv_row(b, i, g) * d.value_dim, d.value_dim);
    for (int64_t h = g * d.group_size; h < (g + 1) * d.group_size; ++h) {
      const int64_t head_row = (b * d.q_heads + h) * d.max_keys + j;
      dk_i += ConstVectorMap<T>(head_dk.data() + head_row * d.key_dim, d.key_dim);
      dv_i += ConstVectorMap<T>(head_dv.data() + head_row * d.value_dim, d.value_dim);
    }
    // dv_i holds dv'_i here.
    dp += dv_i.dot(ConstVectorMap<T>(v + d.kv_row(b, i, g) * d.value_dim, d.value_dim));
    dv_i *= p;
  }
  if (dvalue_scale) dvalue_scale[b * d.seq_len + i] = dp;
}

}  // namespace

void compact_selection(const Tensor& select, const Tensor& doc_ids, CompactSelection& out) {
  const int64_t batch = select.size(0), seq_len = select.size(1);
  const uint8_t* selected = select.data<uint8_t>();
  const std::vector<int64_t> docs =
      doc_ids.defined() ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
  int64_t* positions = out.key_positions.data<int64_t>();
  int64_t* counts = out.key_counts.data<int64_t>();
  int64_t* begin = out.visible_begin.data<int64_t>();
  int64_t* end = out.visible_end.data<int64_t>();
  parallel_for(batch, seq_len, [&](int64_t b) {
    const int64_t row = b * seq_len;
    // Number the row's documents by first appearance; count each one's selected keys.
    std::unordered_map<int64_t, int64_t> group_of_doc;
    std::vector<int64_t> group(static_cast<size_t>(seq_len)), keys_in_group;
    for (int64_t t = 0; t < seq_len; ++t) {
      int64_t doc = docs.empty() ? 0 : docs[size_t(row + t)];
      auto [it, inserted] = group_of_doc.try_emplace(doc, int64_t(keys_in_group.size()));
      if (inserted) keys_in_group.push_back(0);
      group[size_t(t)] = it->second;
      if (selected[row + t]) ++keys_in_group[size_t(it->second)];
    }
    // Document g's keys occupy [group_start[g], group_start[g] + keys_in_group[g]).
    std::vector<int64_t> group_start(keys_in_group.size()), next_slot(keys_in_group.size());
    int64_t total = 0;
    for (size_t g = 0; g < keys_in_group.size(); ++g) {
      group_start[g] = next_slot[g] = total;
      total += keys_in_group[g];
    }
    // Running pointers: query t sees its document's keys selected so far (t included).
    for (int64_t t = 0; t < seq_len; ++t) {
      size_t g = size_t(group[size_t(t)]);
      if (selected[row + t]) positions[row + next_slot[g]++] = t;
      begin[row + t] = group_start[g];
      end[row + t] = next_slot[g];
    }
    std::fill(positions + row + total, positions + row + seq_len, int64_t(-1));
    counts[b] = total;
  });
}

void routed_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& value_scale, const CompactSelection& selection,
                              double scale, Tensor& out, Tensor& lse) {
  dispatch_floating("routed_attention", q.dtype(), [&]<class T>() {
    const Dims d(q, v, selection);
    const CompactKeysValues<T> kv = gather_selected<T>(d, k, v, value_scale, selection);
    const ForwardBuffers<T> f{q.data<T>(),
                              out.data<T>(),
                              lse.data<T>(),
                              selection.visible_begin.data<int64_t>(),
                              selection.visible_end.data<int64_t>(),
                              T(scale)};
    const int64_t blocks = (d.seq_len + kQueryBlock - 1) / kQueryBlock;
    const int64_t cost = kQueryBlock * d.max_keys * (d.key_dim + d.value_dim);
    std::atomic<int64_t> scores_evaluated{0};
    parallel_for(d.batch * d.q_heads * blocks, cost, [&](int64_t task) {
      const int64_t b = task / (d.q_heads * blocks), h = task / blocks % d.q_heads;
      const int64_t t_first = task % blocks * kQueryBlock;
      const int64_t t_last = std::min(t_first + kQueryBlock, d.seq_len);
      const KeyValueBlock<T> block(kv, d, b, d.kv_head_of(h));
      scores_evaluated += forward_query_block(d, f, block, b, h, t_first, t_last);
    });
    g_forward_score_count = scores_evaluated.load();
  });
}

void routed_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& value_scale,
                               const CompactSelection& selection, const Tensor& out,
                               const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                               Tensor& dvalue_scale) {
  dispatch_floating("routed_attention backward", q.dtype(), [&]<class T>() {
    const Dims d(q, v, selection);
    const CompactKeysValues<T> kv = gather_selected<T>(d, k, v, value_scale, selection);
    const BackwardBuffers<T> f{q.data<T>(),
                               dout.data<T>(),
                               out.data<T>(),
                               lse.data<T>(),
                               dq.data<T>(),
                               selection.visible_begin.data<int64_t>(),
                               selection.visible_end.data<int64_t>(),
                               T(scale)};

    // 1. Per (b, query head), in compacted key order: dq, and dk, dv' of that head alone.
    std::vector<T> head_dk(size_t(d.batch * d.q_heads * d.max_keys * d.key_dim), T(0));
    std::vector<T> head_dv(size_t(d.batch * d.q_heads * d.max_keys * d.value_dim), T(0));
    const int64_t cost = d.seq_len * d.max_keys * (d.key_dim + d.value_dim);
    std::atomic<int64_t> scores_evaluated{0};
    parallel_for(d.batch * d.q_heads, cost, [&](int64_t task) {
      const int64_t b = task / d.q_heads, h = task % d.q_heads;
      const KeyValueBlock<T> block(kv, d, b, d.kv_head_of(h));
      MatrixMap<T> task_dk(head_dk.data() + task * d.max_keys * d.key_dim, d.max_keys, d.key_dim);
      MatrixMap<T> task_dv(head_dv.data() + task * d.max_keys * d.value_dim, d.max_keys,
                           d.value_dim);
      scores_evaluated += backward_query_head(d, f, block, b, h, task_dk, task_dv);
    });
    g_backward_score_count = scores_evaluated.load();

    // 2. Group sums, value scaling and scatter; unselected positions keep their zeros.
    dk.zero_();
    dv.zero_();
    if (dvalue_scale.defined()) dvalue_scale.zero_();
    const T* pp = value_scale.defined() ? value_scale.data<T>() : nullptr;
    T* pdp = dvalue_scale.defined() ? dvalue_scale.data<T>() : nullptr;
    const int64_t* positions = selection.key_positions.data<int64_t>();
    const int64_t* counts = selection.key_counts.data<int64_t>();
    parallel_for(d.batch * d.max_keys, d.q_heads * (d.key_dim + d.value_dim), [&](int64_t task) {
      const int64_t b = task / d.max_keys, j = task % d.max_keys;
      if (j >= counts[b]) return;
      scatter_key_gradients(d, b, j, positions[b * d.seq_len + j], head_dk, head_dv, v.data<T>(),
                            pp, dk.data<T>(), dv.data<T>(), pdp);
    });
  });
}

void masked_attention_naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& select,
                            const Tensor& value_scale, const Tensor& doc_ids, double scale,
                            Tensor& out) {
  dispatch_floating("masked_attention_naive", q.dtype(), [&]<class T>() {
    const int64_t batch = q.size(0), seq_len = q.size(1), q_heads = q.size(2);
    const int64_t kv_heads = k.size(2), key_dim = q.size(3), value_dim = v.size(3);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const T* pp = value_scale.defined() ? value_scale.data<T>() : nullptr;
    const uint8_t* selected = select.data<uint8_t>();
    const std::vector<int64_t> docs =
        doc_ids.defined() ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
    T* po = out.data<T>();
    std::vector<uint8_t> mask(static_cast<size_t>(seq_len * seq_len));  // mask[t, i] = i in S(b, t)
    std::vector<T> scores(static_cast<size_t>(seq_len));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < seq_len; ++t) {
        for (int64_t i = 0; i < seq_len; ++i) {
          bool same_doc =
              docs.empty() || docs[size_t(b * seq_len + i)] == docs[size_t(b * seq_len + t)];
          mask[size_t(t * seq_len + i)] = i <= t && selected[b * seq_len + i] != 0 && same_doc;
        }
      }
      for (int64_t t = 0; t < seq_len; ++t) {
        for (int64_t h = 0; h < q_heads; ++h) {
          const int64_t g = h / (q_heads / kv_heads);
          const T* q_t = pq + ((b * seq_len + t) * q_heads + h) * key_dim;
          T* o_t = po + ((b * seq_len + t) * q_heads + h) * value_dim;
          T s_max = -std::numeric_limits<T>::infinity();
          bool any_visible = false;
          for (int64_t i = 0; i < seq_len; ++i) {
            if (!mask[size_t(t * seq_len + i)]) continue;
            any_visible = true;
            const T* k_i = pk + ((b * seq_len + i) * kv_heads + g) * key_dim;
            T dot = T(0);
            for (int64_t e = 0; e < key_dim; ++e) dot += q_t[e] * k_i[e];
            scores[size_t(i)] = T(scale) * dot;
            s_max = std::max(s_max, scores[size_t(i)]);
          }
          std::fill(o_t, o_t + value_dim, T(0));
          if (!any_visible) continue;  // o_t = 0
          T sum = T(0);
          for (int64_t i = 0; i < seq_len; ++i) {
            if (mask[size_t(t * seq_len + i)]) sum += std::exp(scores[size_t(i)] - s_max);
          }
          for (int64_t i = 0; i < seq_len; ++i) {
            if (!mask[size_t(t * seq_len + i)]) continue;
            const T weight = std::exp(scores[size_t(i)] - s_max) / sum;
            const T p = pp ? pp[b * seq_len + i] : T(1);
            const T* v_i = pv + ((b * seq_len + i) * kv_heads + g) * value_dim;
            for (int64_t e = 0; e < value_dim; ++e) o_t[e] += weight * p * v_i[e];
          }
        }
      }
    }
  });
}

ops::RoutedAttentionScoreCounts routed_attention_last_score_counts() {
  return {g_forward_score_count.load(), g_backward_score_count.load()};
}

}  // namespace ham::cpu
