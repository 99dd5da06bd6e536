// CPU kernels of routed attention; the math is in core/ops/routed_attention.h.
//
// How the work is laid out:
//   compaction  one O(T) pass per batch row.
//   gather      each row's selected keys and scaled values v' = p v are copied into
//               contiguous [B, Hkv, N, D] buffers (N = most keys in any row), so a query
//               reads its visible keys as one contiguous block of rows.
//   forward     parallel over (b, query head, tile of 64 queries). A tile is cut into
//               segments, one document's queries each; a segment's scores against the keys
//               its queries see are one matrix product, masked past each query's last key,
//               then a two-pass softmax per row and a second product for the output.
//               The products are ham's GEMM on the task's thread (core/cpu/matmul.h).
//   backward    parallel over (b, query head); per segment five matrix products give dq and
//               this head's dk, dv', accumulated in the task's own buffer. Then one pass
//               sums the heads of each kv group in a fixed order (deterministic), applies the
//               value scaling and scatters to the original positions.
#include "core/ops/routed_attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "core/cpu/matmul.h"
#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
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

std::atomic<int64_t> g_forward_visible_scores{0}, g_forward_computed_scores{0};
std::atomic<int64_t> g_backward_visible_scores{0}, g_backward_computed_scores{0};

constexpr int64_t kQueryTile = ops::kRoutedAttentionCpuQueryTile;

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
// position key_positions[b, j]. Rows from key_counts[b] on are never read, so never
// written. Tensors, so that the pool serves them and the peak memory counts them.
template <class T>
struct CompactKeysValues {
  Tensor keys, values;  // [B, Hkv, N, Dk], [B, Hkv, N, Dv]
};

template <class T>
CompactKeysValues<T> gather_selected(const Dims& d, const Tensor& k, const Tensor& v,
                                     const Tensor& value_scale, const CompactSelection& selection) {
  CompactKeysValues<T> kv;
  kv.keys = Tensor::empty({d.batch, d.kv_heads, d.max_keys, d.key_dim}, k.dtype());
  kv.values = Tensor::empty({d.batch, d.kv_heads, d.max_keys, d.value_dim}, v.dtype());
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
      T* k_dst = kv.keys.template data<T>() + (d.compact_row(b, g) + j) * d.key_dim;
      T* v_dst = kv.values.template data<T>() + (d.compact_row(b, g) + j) * d.value_dim;
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
      : keys(kv.keys.template data<T>() + d.compact_row(b, g) * d.key_dim, d.max_keys,
             d.key_dim),
        values(kv.values.template data<T>() + d.compact_row(b, g) * d.value_dim, d.max_keys,
               d.value_dim) {}
};

template <class T>
using StridedMatrixMap = Eigen::Map<RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMatrixMap = Eigen::Map<const RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;

// Consecutive queries [first, last) of one query tile that share the start `lo` of their
// visible key range: one document's queries (an empty document's may join the next
// one's). Query t sees compacted keys [lo, visible_end[t]), all inside [lo, lo + width).
struct QuerySegment {
  int64_t first, last, lo, width;
};

// Calls fn(segment) for the segments of queries [t_first, t_last) of one batch row, whose
// visible ranges are visible_begin/visible_end (already offset to the row).
template <class Fn>
void for_each_query_segment(const int64_t* visible_begin, const int64_t* visible_end,
                            int64_t t_first, int64_t t_last, Fn&& fn) {
  for (int64_t first = t_first; first < t_last;) {
    const int64_t lo = visible_begin[first];
    int64_t last = first, hi = lo;
    while (last < t_last && visible_begin[last] == lo) hi = std::max(hi, visible_end[last++]);
    fn(QuerySegment{first, last, lo, hi - lo});
    first = last;
  }
}

// Columns of the score scratch: max_keys rounded up to whole packets, for exp_shifted's
// padding, and so that every row starts on a packet boundary. Eigen's sums and dots over a
// row then add in the same order whatever max_keys is: the CPU (max_keys = most keys) and
// an emulated device (max_keys = T) give the same bits (tests/device/test_emulated_device).
template <class T>
int64_t score_columns(int64_t max_keys) {
  return (max_keys + kPacketSize<T> - 1) / kPacketSize<T> * kPacketSize<T>;
}

// x[0, n) = e^(x[0, n) - shift), by Eigen packets throughout (exp_packet), the last one
// padded into x[n, n rounded up to a packet), which the caller's row has room for and which
// is left 0. Eigen's own .exp() sends the entries after a row's last whole packet to
// glibc's scalar expf: a tenth of the time of a softmax over short rows.
template <class T>
void exp_shifted(T* x, int64_t n, T shift) {
  constexpr int64_t lanes = kPacketSize<T>;
  const int64_t padded = (n + lanes - 1) / lanes * lanes;
  std::fill(x + n, x + padded, shift);  // e^0 there: finite whatever the shift
  const Packet<T> shift_packet = pk::pset1<Packet<T>>(shift);
  for (int64_t j = 0; j < padded; j += lanes) {
    pk::pstoreu(x + j, exp_packet(pk::psub(pk::ploadu<Packet<T>>(x + j), shift_packet)));
  }
  std::fill(x + n, x + padded, T(0));
}

// Scores the kernels evaluated: `visible` enter a softmax (one per query, visible key and
// head); `computed` also counts the masked ones of a segment's rectangular product.
struct ScoreTally {
  std::atomic<int64_t> visible{0}, computed{0};
};

// Rows [first, first + rows) of head h of a [B, T, H, D] tensor, as a strided matrix.
template <class T>
StridedMatrixMap<T> head_rows(T* data, const Dims& d, int64_t b, int64_t h, int64_t first,
                              int64_t rows, int64_t heads, int64_t dim) {
  const int64_t offset = ((b * d.seq_len + first) * heads + h) * dim;
  return StridedMatrixMap<T>(data + offset, rows, dim, Eigen::OuterStride<>(heads * dim));
}
template <class T>
ConstStridedMatrixMap<T> head_rows(const T* data, const Dims& d, int64_t b, int64_t h,
                                   int64_t first, int64_t rows, int64_t heads, int64_t dim) {
  const int64_t offset = ((b * d.seq_len + first) * heads + h) * dim;
  return ConstStridedMatrixMap<T>(data + offset, rows, dim, Eigen::OuterStride<>(heads * dim));
}

// What the forward reads and writes, as raw row-major pointers.
template <class T>
struct ForwardBuffers {
  const T* q;
  T* out;
  T* lse;
  const int64_t *visible_begin, *visible_end;
  T scale;
};

// Forward of one segment of batch row b, query head h. With Q the segment's queries
// [m, Dk] and K, V' its keys and scaled values [lo, lo + width):
//   S = scale Q K^T  (one product; entries past a query's visible end are masked)
//   row t over its visible keys:  e_i = exp(s_i - max s),  lse_t = max s + log sum e_i
//   O = diag(1 / sum e) E V'  (a second product); rows with no visible key: o = 0, lse = -inf.
// `scores` is scratch of at least [m, score_columns(width)].
template <class T>
void forward_segment(const Dims& d, const ForwardBuffers<T>& f, const KeyValueBlock<T>& kv,
                     int64_t b, int64_t h, const QuerySegment& s, RowMajorMatrix<T>& scores,
                     ProductOnThisThread<T>& product, ScoreTally& tally) {
  const int64_t m = s.last - s.first;
  auto o = head_rows(f.out, d, b, h, s.first, m, d.q_heads, d.value_dim);
  T* lse = f.lse + d.q_row(b, s.first, h);  // stride q_heads
  if (s.width == 0) {
    o.setZero();
    for (int64_t r = 0; r < m; ++r) lse[r * d.q_heads] = -std::numeric_limits<T>::infinity();
    return;
  }
  const int64_t* end = f.visible_end + b * d.seq_len + s.first;
  auto e = scores.topLeftCorner(m, s.width);
  product.assign(e, head_rows(f.q, d, b, h, s.first, m, d.q_heads, d.key_dim),
                 kv.keys.middleRows(s.lo, s.width).transpose());
  Vector<T> inverse_sum(m);
  int64_t visible = 0;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t n = end[r] - s.lo;
    visible += n;
    // The row as a plain vector; the scratch row has room for exp_shifted's padding.
    VectorMap<T> row(e.row(r).data(), s.width);
    row.tail(s.width - n).setZero();
    if (n == 0) {
      inverse_sum[r] = T(0);
      lse[r * d.q_heads] = -std::numeric_limits<T>::infinity();
      continue;
    }
    auto head = row.head(n);
    head *= f.scale;
    const T s_max = head.maxCoeff();
    exp_shifted(head.data(), n, s_max);
    const T sum = head.sum();
    inverse_sum[r] = T(1) / sum;
    lse[r * d.q_heads] = s_max + std::log(sum);
  }
  product.assign(o, e, kv.values.middleRows(s.lo, s.width));
  o.array().colwise() *= inverse_sum.array();
  for (int64_t r = 0; r < m; ++r) {
    if (end[r] == s.lo) o.row(r).setZero();  // exactly 0, even next to non-finite values
  }
  tally.visible += visible;
  tally.computed += m * s.width;
}

// What the backward reads and writes, as raw row-major pointers.
template <class T>
struct BackwardBuffers {
  const T *q, *dout, *lse;
  T* dq;
  const int64_t *visible_begin, *visible_end;
  T scale;
};

// Backward of one segment of batch row b, query head h (Q, dO its rows; K, V' its keys):
//   P  = exp(scale Q K^T - lse)  (masked entries 0),   dP = dO V'^T,   D_t = sum_i P_ti dP_ti
//   dS = P * (dP - D)   (elementwise; masked entries 0)
// D_t is the sum, not <dO_t, o_t>: equal in exact arithmetic, but the sum is rounded like dP
// itself. So a query with one visible key gets exactly dS = 0, and dq, dk exactly 0 (their
// true value), not rounding noise: its scaled score is recomputed bit for bit as the forward
// rounded it, lse equals it, and P = exp(0) = 1.
//   dQ = scale dS K,   head_dk[lo:] += scale dS^T Q,   head_dv[lo:] += P^T dO
// Five matrix products; head_dk, head_dv [N, D] are this head's compacted rows.
// `probs` and `dscores` are scratch of at least [m, score_columns(width)].
template <class T>
void backward_segment(const Dims& d, const BackwardBuffers<T>& f, const KeyValueBlock<T>& kv,
                      int64_t b, int64_t h, const QuerySegment& s, MatrixMap<T> head_dk,
                      MatrixMap<T> head_dv, RowMajorMatrix<T>& probs, RowMajorMatrix<T>& dscores,
                      ProductOnThisThread<T>& product, ScoreTally& tally) {
  const int64_t m = s.last - s.first;
  auto dq = head_rows(f.dq, d, b, h, s.first, m, d.q_heads, d.key_dim);
  if (s.width == 0) {  // o = 0 whatever q is, and no key sees these queries
    dq.setZero();
    return;
  }
  const auto q = head_rows(f.q, d, b, h, s.first, m, d.q_heads, d.key_dim);
  const auto dout = head_rows(f.dout, d, b, h, s.first, m, d.q_heads, d.value_dim);
  const T* lse = f.lse + d.q_row(b, s.first, h);  // stride q_heads
  const int64_t* end = f.visible_end + b * d.seq_len + s.first;
  const auto keys = kv.keys.middleRows(s.lo, s.width);
  auto p = probs.topLeftCorner(m, s.width);
  auto ds = dscores.topLeftCorner(m, s.width);
  product.assign(p, q, keys.transpose());
  product.assign(ds, dout, kv.values.middleRows(s.lo, s.width).transpose());  // dP
  int64_t visible = 0;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t n = end[r] - s.lo;
    visible += n;
    VectorMap<T> p_row(p.row(r).data(), s.width), ds_row(ds.row(r).data(), s.width);
    p_row.tail(s.width - n).setZero();
    ds_row.tail(s.width - n).setZero();
    if (n == 0) continue;
    auto p_head = p_row.head(n);
    auto ds_head = ds_row.head(n);
    p_head *= f.scale;  // rounded as the forward rounds it (no fused multiply-subtract)
    exp_shifted(p_head.data(), n, lse[r * d.q_heads]);
    const T delta = p_head.dot(ds_head);
    ds_head = p_head.cwiseProduct((ds_head.array() - delta).matrix());
  }
  product.assign(dq, ds, keys, f.scale);
  for (int64_t r = 0; r < m; ++r) {
    if (end[r] == s.lo) dq.row(r).setZero();  // exactly 0, even next to non-finite values
  }
  product.add(head_dk.middleRows(s.lo, s.width), ds.transpose(), q, f.scale);
  product.add(head_dv.middleRows(s.lo, s.width), p.transpose(), dout);
  tally.visible += visible;
  tally.computed += m * s.width;
}

// For compacted key j of batch row b (original position i), sums the query heads of each
// kv group in a fixed order and scatters to position i:
//   dk_i = sum_h dk_{h,i},  dv'_i = sum_h dv'_{h,i},  dv_i = p_i dv'_i,
//   dp_i = sum_g <dv'_{i,g}, v_{i,g}>.
template <class T>
void scatter_key_gradients(const Dims& d, int64_t b, int64_t j, int64_t i,
                           const T* head_dk, const T* head_dv, const T* v,
                           const T* value_scale, T* dk, T* dv, T* dvalue_scale) {
  const T p = value_scale ? value_scale[b * d.seq_len + i] : T(1);
  T dp = T(0);
  for (int64_t g = 0; g < d.kv_heads; ++g) {
    VectorMap<T> dk_i(dk + d.kv_row(b, i, g) * d.key_dim, d.key_dim);
    VectorMap<T> dv_i(dv + d.kv_row(b, i, g) * d.value_dim, d.value_dim);
    for (int64_t h = g * d.group_size; h < (g + 1) * d.group_size; ++h) {
      const int64_t head_row = (b * d.q_heads + h) * d.max_keys + j;
      dk_i += ConstVectorMap<T>(head_dk + head_row * d.key_dim, d.key_dim);
      dv_i += ConstVectorMap<T>(head_dv + head_row * d.value_dim, d.value_dim);
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
    const int64_t tiles = (d.seq_len + kQueryTile - 1) / kQueryTile;
    const int64_t cost = kQueryTile * d.max_keys * (d.key_dim + d.value_dim);
    ScoreTally tally;
    parallel_for(d.batch * d.q_heads * tiles, cost, [&](int64_t task) {
      const int64_t b = task / (d.q_heads * tiles), h = task / tiles % d.q_heads;
      const int64_t t_first = task % tiles * kQueryTile;
      const int64_t t_last = std::min(t_first + kQueryTile, d.seq_len);
      const KeyValueBlock<T> block(kv, d, b, d.kv_head_of(h));
      RowMajorMatrix<T> scores(t_last - t_first, score_columns<T>(d.max_keys));
      ProductOnThisThread<T> product;
      const int64_t row = b * d.seq_len;
      for_each_query_segment(f.visible_begin + row, f.visible_end + row, t_first, t_last,
                             [&](const QuerySegment& s) {
                               forward_segment(d, f, block, b, h, s, scores, product, tally);
                             });
    });
    g_forward_visible_scores = tally.visible.load();
    g_forward_computed_scores = tally.computed.load();
  });
}

// `out` is not read: D_t comes from P and dP (see backward_segment).
void routed_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& value_scale,
                               const CompactSelection& selection, const Tensor& /*out*/,
                               const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                               Tensor& dvalue_scale) {
  dispatch_floating("routed_attention backward", q.dtype(), [&]<class T>() {
    const Dims d(q, v, selection);
    const CompactKeysValues<T> kv = gather_selected<T>(d, k, v, value_scale, selection);
    const BackwardBuffers<T> f{q.data<T>(),
                               dout.data<T>(),
                               lse.data<T>(),
                               dq.data<T>(),
                               selection.visible_begin.data<int64_t>(),
                               selection.visible_end.data<int64_t>(),
                               T(scale)};

    // 1. Per (b, query head), in compacted key order: dq, and dk, dv' of that head alone.
    Tensor head_dk = Tensor::zeros({d.batch, d.q_heads, d.max_keys, d.key_dim}, q.dtype());
    Tensor head_dv = Tensor::zeros({d.batch, d.q_heads, d.max_keys, d.value_dim}, q.dtype());
    const int64_t cost = d.seq_len * d.max_keys * (d.key_dim + d.value_dim);
    ScoreTally tally;
    parallel_for(d.batch * d.q_heads, cost, [&](int64_t task) {
      const int64_t b = task / d.q_heads, h = task % d.q_heads;
      const KeyValueBlock<T> block(kv, d, b, d.kv_head_of(h));
      MatrixMap<T> task_dk(head_dk.data<T>() + task * d.max_keys * d.key_dim, d.max_keys,
                           d.key_dim);
      MatrixMap<T> task_dv(head_dv.data<T>() + task * d.max_keys * d.value_dim, d.max_keys,
                           d.value_dim);
      RowMajorMatrix<T> probs(std::min(kQueryTile, d.seq_len), score_columns<T>(d.max_keys));
      RowMajorMatrix<T> dscores(probs.rows(), probs.cols());
      ProductOnThisThread<T> product;
      const int64_t row = b * d.seq_len;
      for (int64_t t_first = 0; t_first < d.seq_len; t_first += kQueryTile) {
        const int64_t t_last = std::min(t_first + kQueryTile, d.seq_len);
        for_each_query_segment(f.visible_begin + row, f.visible_end + row, t_first, t_last,
                               [&](const QuerySegment& s) {
                                 backward_segment(d, f, block, b, h, s, task_dk, task_dv, probs,
                                                  dscores, product, tally);
                               });
      }
    });
    g_backward_visible_scores = tally.visible.load();
    g_backward_computed_scores = tally.computed.load();

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
      scatter_key_gradients(d, b, j, positions[b * d.seq_len + j], head_dk.data<T>(),
                            head_dv.data<T>(), v.data<T>(), pp, dk.data<T>(), dv.data<T>(), pdp);
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
  return {g_forward_visible_scores.load(), g_backward_visible_scores.load(),
          g_forward_computed_scores.load(), g_backward_computed_scores.load()};
}

}  // namespace ham::cpu
