// CPU gated delta rule: the chunked forward and its backward (one (b, h) pair per thread;
// matrix products by ham's GEMM on the pair's thread, the rest by Eigen), and the
// token-by-token recurrence. The math is in core/ops/gated_delta_rule.h;
// each step below names the formula it implements.
//
// Layout: each (b, h) pair's rows are copied out of [B, T, H, D] into contiguous
// row-major matrices in one pool-backed scratch tensor per pair; queries and keys are
// interleaved chunk by chunk, so a chunk's [Q; K] is one block. Documents are independent
// segments [begin, end): every segment is chunked from its own first token, so no chunk
// holds a document start and no masking across documents is needed.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cpu/gated_delta_rule_step.h"
#include "core/cpu/matmul.h"
#include "core/cpu/parallel.h"
#include "core/ops/gated_delta_rule.h"

namespace ham::cpu {

namespace {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
template <class Scalar>
using MatrixMap = Eigen::Map<Matrix<Scalar>>;
template <class Scalar>
using VectorMap = Eigen::Map<Vector<Scalar>>;

struct Dims {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};

Dims dims_of(const GatedDeltaRuleArgs& a) {
  return {a.q.size(0), a.q.size(1), a.q.size(2), a.q.size(3), a.v.size(3)};
}

using Segment = std::pair<int64_t, int64_t>;  // token rows [begin, end) of one document

// Document segments of batch row b; one segment [0, T) without doc_ids.
std::vector<Segment> document_segments(const std::vector<int64_t>& doc_ids, int64_t b,
                                       int64_t seq_len) {
  std::vector<Segment> segments;
  int64_t begin = 0;
  for (int64_t t = 1; t <= seq_len; ++t) {
    bool boundary = t == seq_len || (!doc_ids.empty() && doc_ids[size_t(b * seq_len + t)] !=
                                                             doc_ids[size_t(b * seq_len + t - 1)]);
    if (boundary) {
      segments.push_back({begin, t});
      begin = t;
    }
  }
  return segments;
}

std::vector<int64_t> doc_ids_of(const GatedDeltaRuleArgs& a) {
  return a.doc_ids.defined() ? a.doc_ids.to_vector<int64_t>() : std::vector<int64_t>{};
}

// Scratch of one (b, h) pair: one pool tensor, handed out front to back, and the pair's
// products with their packing buffer. From the pool so that repeated calls reuse the same
// memory (Eigen temporaries faulted fresh pages in on every call: a fifth of forward +
// backward's time at T 2048), and so that the peak memory counts it.
template <class Scalar>
class Scratch {
 public:
  ProductOnThisThread<Scalar> product;

  // Every piece starts on a 64-byte line.
  static int64_t rounded(int64_t elements) {
    constexpr int64_t line = 64 / int64_t(sizeof(Scalar));
    return (elements + line - 1) / line * line;
  }

  explicit Scratch(int64_t elements)
      : storage_(Tensor::empty({std::max<int64_t>(elements, 1)}, dtype_of<Scalar>())),
        next_(storage_.data<Scalar>()),
        end_(next_ + storage_.numel()) {}

  MatrixMap<Scalar> matrix(int64_t rows, int64_t cols) {
    return MatrixMap<Scalar>(take(rows * cols), rows, cols);
  }
  VectorMap<Scalar> vector(int64_t size) { return VectorMap<Scalar>(take(size), size); }
  // Pieces taken after mark() are given back by release_to(mark).
  Scalar* mark() const { return next_; }
  void release_to(Scalar* mark) { next_ = mark; }

 private:
  Scalar* take(int64_t elements) {
    elements = rounded(elements);
    HAM_CHECK(end_ - next_ >= elements, "gated_delta_rule (cpu): the pair's scratch of ",
              storage_.numel(), " elements is short by ", elements - (end_ - next_),
              " (an internal sizing error)");
    Scalar* piece = next_;
    next_ += elements;
    return piece;
  }

  Tensor storage_;
  Scalar* next_;
  Scalar* end_;
};

// A chunk: rows [begin, begin + size) of the head. Each document is cut into chunks from its
// own first token.
struct Chunk {
  int64_t begin = 0, size = 0;
};

std::vector<Chunk> chunks_of(const Segment& segment) {
  std::vector<Chunk> chunks;
  for (int64_t begin = segment.first; begin < segment.second; begin += kGatedDeltaRuleChunkSize) {
    chunks.push_back({begin, std::min(kGatedDeltaRuleChunkSize, segment.second - begin)});
  }
  return chunks;
}

// Most chunks in one segment: the backward keeps one segment's chunk terms at a time.
int64_t most_chunks_in_a_segment(const std::vector<Segment>& segments) {
  int64_t most = 0;
  for (const Segment& segment : segments) most = std::max(most, int64_t(chunks_of(segment).size()));
  return most;
}

// Offset of token t's row in a [B, T, H, width] tensor.
int64_t row_offset(const Dims& d, int64_t b, int64_t t, int64_t h, int64_t width) {
  return ((b * d.seq_len + t) * d.heads + h) * width;
}

// Rows of head h, batch b of a [B, T, H, width] tensor into a contiguous [T, width] matrix,
// and back.
template <class Scalar>
void gather_head(const Scalar* base, const Dims& d, int64_t b, int64_t h, MatrixMap<Scalar> rows) {
  const int64_t width = rows.cols();
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const Scalar* src = base + row_offset(d, b, t, h, width);
    std::copy(src, src + width, rows.row(t).data());
  }
}

template <class Scalar>
void scatter_head(const MatrixMap<Scalar>& rows, Scalar* base, const Dims& d, int64_t b,
                  int64_t h) {
  const int64_t width = rows.cols();
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const Scalar* src = rows.row(t).data();
    std::copy(src, src + width, base + row_offset(d, b, t, h, width));
  }
}

// Queries and keys of one head, chunk by chunk: a chunk's queries in rows
// [2 begin, 2 begin + size), its keys in the next `size` rows. [Q; K] of a chunk is then one
// [2 size, K] block, so that one product with S0 gives Q S0 and K S0, and one with K^T
// gives Q K^T and K K^T. dq and dk are laid out the same way.
template <class Scalar>
void gather_queries_and_keys(const Scalar* q, const Scalar* k, const Dims& d, int64_t b,
                             int64_t h, const std::vector<Segment>& segments,
                             MatrixMap<Scalar> qk) {
  const int64_t width = d.key_dim;
  for (const Segment& segment : segments) {
    for (const Chunk& c : chunks_of(segment)) {
      for (int64_t i = 0; i < c.size; ++i) {
        const int64_t offset = row_offset(d, b, c.begin + i, h, width);
        std::copy(q + offset, q + offset + width, qk.row(2 * c.begin + i).data());
        std::copy(k + offset, k + offset + width, qk.row(2 * c.begin + c.size + i).data());
      }
    }
  }
}

// dq and dk from that layout to [B, T, H, K]; a null destination is not wanted.
template <class Scalar>
void scatter_queries_and_keys(const MatrixMap<Scalar>& qk, const Dims& d, int64_t b, int64_t h,
                              const std::vector<Segment>& segments, Scalar* q, Scalar* k) {
  const int64_t width = d.key_dim;
  for (const Segment& segment : segments) {
    for (const Chunk& c : chunks_of(segment)) {
      for (int64_t i = 0; i < c.size; ++i) {
        const int64_t offset = row_offset(d, b, c.begin + i, h, width);
        const Scalar* q_row = qk.row(2 * c.begin + i).data();
        const Scalar* k_row = qk.row(2 * c.begin + c.size + i).data();
        if (q != nullptr) std::copy(q_row, q_row + width, q + offset);
        if (k != nullptr) std::copy(k_row, k_row + width, k + offset);
      }
    }
  }
}

// Per-token gates [B, T, H] of one head as a [T] vector, and back.
template <class Scalar>
void gather_gate(const Scalar* base, const Dims& d, int64_t b, int64_t h, VectorMap<Scalar> gate) {
  for (int64_t t = 0; t < d.seq_len; ++t) gate(t) = base[row_offset(d, b, t, h, 1)];
}

template <class Scalar>
void scatter_gate(const VectorMap<Scalar>& gate, Scalar* base, const Dims& d, int64_t b,
                  int64_t h) {
  for (int64_t t = 0; t < d.seq_len; ++t) base[row_offset(d, b, t, h, 1)] = gate(t);
}

// One (b, h) pair's inputs, contiguous, in the pair's scratch.
template <class Scalar>
struct HeadInputs {
  MatrixMap<Scalar> qk;       // [2T, K], chunk by chunk (gather_queries_and_keys)
  MatrixMap<Scalar> v;        // [T, V]
  VectorMap<Scalar> g, beta;  // [T]
  MatrixMap<Scalar> h0;       // [K, V]; zeros without an initial state

  static int64_t elements(const Dims& d) {
    using S = Scratch<Scalar>;
    return S::rounded(2 * d.seq_len * d.key_dim) + S::rounded(d.seq_len * d.value_dim) +
           2 * S::rounded(d.seq_len) + S::rounded(d.key_dim * d.value_dim);
  }

  HeadInputs(const GatedDeltaRuleArgs& a, const Dims& d, int64_t b, int64_t h,
             const std::vector<Segment>& segments, Scratch<Scalar>& scratch)
      : qk(scratch.matrix(2 * d.seq_len, d.key_dim)),
        v(scratch.matrix(d.seq_len, d.value_dim)),
        g(scratch.vector(d.seq_len)),
        beta(scratch.vector(d.seq_len)),
        h0(scratch.matrix(d.key_dim, d.value_dim)) {
    gather_queries_and_keys(a.q.data<Scalar>(), a.k.data<Scalar>(), d, b, h, segments, qk);
    gather_head(a.v.data<Scalar>(), d, b, h, v);
    gather_gate(a.g.data<Scalar>(), d, b, h, g);
    gather_gate(a.beta.data<Scalar>(), d, b, h, beta);
    if (a.h0.defined()) {
      h0 = Eigen::Map<const Matrix<Scalar>>(
          a.h0.data<Scalar>() + (b * d.heads + h) * d.key_dim * d.value_dim, d.key_dim,
          d.value_dim);
    } else {
      h0.setZero();
    }
  }

  auto queries_and_keys(const Chunk& c) const { return qk.middleRows(2 * c.begin, 2 * c.size); }
  auto queries(const Chunk& c) const { return qk.middleRows(2 * c.begin, c.size); }
  auto keys(const Chunk& c) const { return qk.middleRows(2 * c.begin + c.size, c.size); }
};

// Everything of one chunk that the forward output and the backward read, given the
// chunk's start state S0, in the pair's scratch.
template <class Scalar>
struct ChunkTerms {
  Chunk chunk;
  MatrixMap<Scalar> state_in;       // S0 [K, V]
  VectorMap<Scalar> decay;          // E_i = e^{G_i}, G = chunk-local cumsum of g
  VectorMap<Scalar> decay_to_end;   // e^{G_last - G_i}
  MatrixMap<Scalar> gamma;          // Gamma_ij = e^{G_i - G_j} for j <= i, 0 above the diagonal
  MatrixMap<Scalar> masked_scores;  // [P; M]: P = tril(Q K^T * Gamma), diagonal included,
                                    //         M = strict_tril(K K^T * Gamma)
  MatrixMap<Scalar> write_lower;    // diag(beta) M: strictly lower part of I + diag(beta) M
  MatrixMap<Scalar> states;         // [Q S0; K S0] [2c, V]
  MatrixMap<Scalar> residual;       // R = V - diag(E) K S0
  MatrixMap<Scalar> v_new;          // u: (I + diag(beta) M) u = diag(beta) R
  Scalar decay_total = 1;           // e^{G_last}

  // Elements of a full chunk's terms; a shorter chunk's take no more.
  static int64_t elements(const Dims& d) {
    using S = Scratch<Scalar>;
    const int64_t c = kGatedDeltaRuleChunkSize;
    return S::rounded(d.key_dim * d.value_dim) + 2 * S::rounded(c) + 2 * S::rounded(c * c) +
           S::rounded(2 * c * c) + S::rounded(2 * c * d.value_dim) +
           2 * S::rounded(c * d.value_dim);
  }

  ChunkTerms(const Chunk& c, const Dims& d, Scratch<Scalar>& scratch)
      : chunk(c),
        state_in(scratch.matrix(d.key_dim, d.value_dim)),
        decay(scratch.vector(c.size)),
        decay_to_end(scratch.vector(c.size)),
        gamma(scratch.matrix(c.size, c.size)),
        masked_scores(scratch.matrix(2 * c.size, c.size)),
        write_lower(scratch.matrix(c.size, c.size)),
        states(scratch.matrix(2 * c.size, d.value_dim)),
        residual(scratch.matrix(c.size, d.value_dim)),
        v_new(scratch.matrix(c.size, d.value_dim)) {}

  auto qk_gamma() const { return masked_scores.topRows(chunk.size); }     // P
  auto kk_gamma() const { return masked_scores.bottomRows(chunk.size); }  // M
  auto q_state() const { return states.topRows(chunk.size); }
  auto k_state() const { return states.bottomRows(chunk.size); }
};

template <class Scalar>
void compute_chunk_terms(const HeadInputs<Scalar>& in, const MatrixMap<Scalar>& state_in,
                         Scratch<Scalar>& scratch, ChunkTerms<Scalar>& c) {
  const int64_t n = c.chunk.size, begin = c.chunk.begin;
  const auto QK = in.queries_and_keys(c.chunk);
  const auto K = in.keys(c.chunk);
  const auto V = in.v.middleRows(begin, n);
  const auto beta = in.beta.segment(begin, n);
  c.state_in = state_in;

  // G (held in `decay` until its exp) in the compute dtype; every exponent below is of
  // G_i - G_j with j <= i (<= 0 for g <= 0), taken only where the mask keeps it: no e^{-G},
  // no inf * 0.
  Scalar running = 0;
  for (int64_t i = 0; i < n; ++i) c.decay(i) = running += in.g(begin + i);
  const Scalar last = c.decay(n - 1);
  c.gamma.setZero();
  for (int64_t i = 0; i < n; ++i) {  // row i: e^{G_i - G_j}, j = 0..i
    c.gamma.row(i).head(i + 1) = (c.decay(i) - c.decay.head(i + 1).array()).exp().transpose();
  }
  c.decay_to_end = (last - c.decay.array()).exp();
  c.decay = c.decay.array().exp();
  c.decay_total = std::exp(last);

  // [Q K^T; K K^T] in one product, then masked: Gamma is 0 above the diagonal, and M's
  // diagonal is 0 too.
  scratch.product.assign(c.masked_scores, QK, K.transpose());
  c.masked_scores.topRows(n).array() *= c.gamma.array();
  c.masked_scores.bottomRows(n).array() *= c.gamma.array();
  c.masked_scores.bottomRows(n).diagonal().setZero();
  c.write_lower = beta.asDiagonal() * c.kk_gamma();

  scratch.product.assign(c.states, QK, c.state_in);  // [Q S0; K S0]
  c.residual = V - c.decay.asDiagonal() * c.k_state();
  // Forward substitution with the unit lower-triangular I + diag(beta) M; this is
  // v_new = A diag(beta) V - A diag(beta E) K S0 = U - W S0 without forming A.
  c.v_new = beta.asDiagonal() * c.residual;
  c.write_lower.template triangularView<Eigen::UnitLower>().solveInPlace(c.v_new);
}

// S_end = e^{G_last} S0 + K^T diag(e^{G_last - G}) v_new, into `state`.
template <class Scalar>
void chunk_end_state(const HeadInputs<Scalar>& in, const ChunkTerms<Scalar>& c,
                     Scratch<Scalar>& scratch, MatrixMap<Scalar>& state) {
  Scalar* mark = scratch.mark();
  MatrixMap<Scalar> scaled_v_new = scratch.matrix(c.chunk.size, c.v_new.cols());
  scaled_v_new = c.decay_to_end.asDiagonal() * c.v_new;
  state = c.decay_total * c.state_in;
  scratch.product.add(state, in.keys(c.chunk).transpose(), scaled_v_new);
  scratch.release_to(mark);
}

// Scratch the forward takes per chunk beyond its terms.
template <class Scalar>
int64_t forward_chunk_scratch_elements(const Dims& d) {
  using S = Scratch<Scalar>;
  const int64_t c = kGatedDeltaRuleChunkSize;
  return 2 * S::rounded(c * d.value_dim);
}

// Chunked forward of one (b, h) pair: fills o [T, V], fit_error [T] (where not null) and
// `state`, the final state [K, V].
template <class Scalar>
void chunked_forward_head(const HeadInputs<Scalar>& in, const std::vector<Segment>& segments,
                          const Dims& d, Scratch<Scalar>& scratch, MatrixMap<Scalar>& o,
                          VectorMap<Scalar>* fit_error, MatrixMap<Scalar>& state) {
  for (const Segment& segment : segments) {
    if (segment.first == 0) state = in.h0;
    else state.setZero();  // document start: the state resets
    for (const Chunk& chunk : chunks_of(segment)) {
      const int64_t n = chunk.size;
      Scalar* mark = scratch.mark();
      ChunkTerms<Scalar> c(chunk, d, scratch);
      compute_chunk_terms(in, state, scratch, c);
      // O = diag(E) Q S0 + P v_new
      auto o_rows = o.middleRows(chunk.begin, n);
      scratch.product.assign(o_rows, c.qk_gamma(), c.v_new);
      o_rows += c.decay.asDiagonal() * c.q_state();
      if (fit_error != nullptr) {
        // Predictions of the decayed pre-write state: p = diag(E) K S0 + M v_new.
        // (p = V - v_new / beta too, but that divides by beta, which may be 0.)
        MatrixMap<Scalar> prediction = scratch.matrix(n, d.value_dim);
        scratch.product.assign(prediction, c.kk_gamma(), c.v_new);
        prediction += c.decay.asDiagonal() * c.k_state();
        for (int64_t i = 0; i < n; ++i) {
          const auto p = prediction.row(i);
          const auto v = in.v.row(chunk.begin + i);
          (*fit_error)(chunk.begin + i) =
              Scalar(1) - p.dot(v) / (p.norm() * v.norm() + Scalar(kFitEpsilon));
        }
      }
      chunk_end_state(in, c, scratch, state);
      scratch.release_to(mark);
    }
  }
  if (segments.empty()) state = in.h0;  // T = 0
}

template <class Scalar>
int64_t forward_scratch_elements(const Dims& d, bool fit_error) {
  using S = Scratch<Scalar>;
  return HeadInputs<Scalar>::elements(d) + S::rounded(d.seq_len * d.value_dim) +
         (fit_error ? S::rounded(d.seq_len) : 0) + ChunkTerms<Scalar>::elements(d) +
         forward_chunk_scratch_elements<Scalar>(d);
}

// Gradients of one (b, h) pair, [T, D] / [T] like the inputs, in the pair's scratch. Each
// chunk writes its own rows of all but dh0.
template <class Scalar>
struct HeadGrads {
  MatrixMap<Scalar> dqk;  // [2T, K], laid out like HeadInputs::qk
  MatrixMap<Scalar> dv;
  VectorMap<Scalar> dg, dbeta;
  MatrixMap<Scalar> dh0;

  static int64_t elements(const Dims& d) {
    return HeadInputs<Scalar>::elements(d);  // the same shapes
  }

  HeadGrads(const Dims& d, Scratch<Scalar>& scratch)
      : dqk(scratch.matrix(2 * d.seq_len, d.key_dim)),
        dv(scratch.matrix(d.seq_len, d.value_dim)),
        dg(scratch.vector(d.seq_len)),
        dbeta(scratch.vector(d.seq_len)),
        dh0(scratch.matrix(d.key_dim, d.value_dim)) {}
};

// Scratch chunk_backward takes.
template <class Scalar>
int64_t chunk_backward_scratch_elements(const Dims& d) {
  using S = Scratch<Scalar>;
  const int64_t c = kGatedDeltaRuleChunkSize, V = d.value_dim;
  return S::rounded(d.key_dim * V) + S::rounded(c * V) + S::rounded(2 * c * V) +
         S::rounded(2 * c * c) + 3 * S::rounded(c * c) + S::rounded(2 * c * c) +
         S::rounded(2 * c * V) + S::rounded(c * V) + S::rounded(c * c) + 2 * S::rounded(c);
}

// Backward of one chunk. grad_state holds dS_end on entry and dS0 on return.
template <class Scalar>
void chunk_backward(const HeadInputs<Scalar>& in, const ChunkTerms<Scalar>& c,
                    const MatrixMap<Scalar>& grad_o, MatrixMap<Scalar>& grad_state,
                    Scratch<Scalar>& scratch, HeadGrads<Scalar>& out) {
  const int64_t n = c.chunk.size, begin = c.chunk.begin;
  const int64_t key_dim = in.qk.cols(), value_dim = in.v.cols();
  const auto QK = in.queries_and_keys(c.chunk);
  const auto K = in.keys(c.chunk);
  const auto beta = in.beta.segment(begin, n);
  const auto dO = grad_o.middleRows(begin, n);
  const MatrixMap<Scalar>& S0 = c.state_in;
  const MatrixMap<Scalar>& u = c.v_new;
  Scalar* mark = scratch.mark();
  MatrixMap<Scalar> dS_end = scratch.matrix(key_dim, value_dim);
  dS_end = grad_state;

  // du = P^T dO + diag(e^{G_last-G}) K dS_end
  MatrixMap<Scalar> k_dstate = scratch.matrix(n, value_dim);
  scratch.product.assign(k_dstate, K, dS_end);
  // [dO; dX]: dX = (I + diag(beta) M)^-T du (back substitution) under dO, so that one
  // product with u^T gives dP = tril(dO u^T) (masked below) and dX u^T.
  MatrixMap<Scalar> do_dx = scratch.matrix(2 * n, value_dim);
  do_dx.topRows(n) = dO;
  auto d_rhs = do_dx.bottomRows(n);
  scratch.product.assign(d_rhs, c.qk_gamma().transpose(), dO);
  d_rhs.noalias() += c.decay_to_end.asDiagonal() * k_dstate;
  c.write_lower.template triangularView<Eigen::UnitLower>().transpose().solveInPlace(d_rhs);
  // Through (I + diag(beta) M) u = diag(beta) R: dR = diag(beta) dX, and
  // d(I + diag(beta) M) = -dX u^T. R = V - diag(E) K S0, so dv = dR.
  auto d_residual = out.dv.middleRows(begin, n);
  d_residual = beta.asDiagonal() * d_rhs;
  MatrixMap<Scalar> d_scores = scratch.matrix(2 * n, n);  // [dO u^T; dX u^T]
  scratch.product.assign(d_scores, do_dx, u.transpose());
  const auto d_qk = d_scores.topRows(n);
  const auto dx_u = d_scores.bottomRows(n);
  // dM = -strict_tril(diag(beta) dX u^T)
  MatrixMap<Scalar> d_kk_gamma = scratch.matrix(n, n);
  d_kk_gamma = -(beta.asDiagonal() * dx_u);
  d_kk_gamma.template triangularView<Eigen::Upper>().setZero();
  // dbeta_i = sum_j -(dX u^T)_ij M_ij + <dX_i, R_i>   (M is 0 on and above the diagonal)
  out.dbeta.segment(begin, n) = -(dx_u.cwiseProduct(c.kk_gamma())).rowwise().sum() +
                                d_rhs.cwiseProduct(c.residual).rowwise().sum();

  // Products with Gamma (0 above the diagonal) apply the masks: dP * Gamma, dM * Gamma.
  MatrixMap<Scalar> d_qk_masked = scratch.matrix(n, n);
  d_qk_masked = d_qk.cwiseProduct(c.gamma);
  MatrixMap<Scalar> d_kk_masked = scratch.matrix(n, n);
  d_kk_masked = d_kk_gamma.cwiseProduct(c.gamma);
  // [(dP * Gamma)^T, dM * Gamma + (dM * Gamma)^T]: times [Q; K], dk's terms in Q and K.
  MatrixMap<Scalar> dk_weights = scratch.matrix(n, 2 * n);
  dk_weights.leftCols(n) = d_qk_masked.transpose();
  dk_weights.rightCols(n) = d_kk_masked + d_kk_masked.transpose();
  // [diag(E) dO; -diag(E) dR]
  MatrixMap<Scalar> e_grads = scratch.matrix(2 * n, value_dim);
  e_grads.topRows(n) = c.decay.asDiagonal() * dO;
  e_grads.bottomRows(n) = -(c.decay.asDiagonal() * d_residual);

  // [dq; dk] = [diag(E) dO; -diag(E) dR] S0^T, then
  //   dq += (dP * Gamma) K
  //   dk += diag(e^{G_last-G}) u dS_end^T + (dP * Gamma)^T Q + (dM * Gamma + (dM * Gamma)^T) K
  auto dqk = out.dqk.middleRows(2 * begin, 2 * n);
  scratch.product.assign(dqk, e_grads, S0.transpose());
  scratch.product.add(dqk.topRows(n), d_qk_masked, K);
  MatrixMap<Scalar> scaled_u = scratch.matrix(n, value_dim);
  scaled_u = c.decay_to_end.asDiagonal() * u;
  scratch.product.add(dqk.bottomRows(n), scaled_u, dS_end.transpose());
  scratch.product.add(dqk.bottomRows(n), dk_weights, QK);

  // dG_i = E_i <dO_i, (Q S0)_i> - E_i <dR_i, (K S0)_i> - e^{G_last-G_i} <(K dS_end)_i, u_i>
  //        + rowsum(Z)_i - colsum(Z)_i,  Z = dP * P + dM * M  (from Gamma_ij = e^{G_i-G_j})
  //        + [i = last] (e^{G_last} <S0, dS_end> + sum_j e^{G_last-G_j} <(K dS_end)_j, u_j>)
  VectorMap<Scalar> to_end_terms = scratch.vector(n);
  to_end_terms = c.decay_to_end.cwiseProduct(k_dstate.cwiseProduct(u).rowwise().sum());
  MatrixMap<Scalar> z = scratch.matrix(n, n);
  z = d_qk.cwiseProduct(c.qk_gamma()) + d_kk_gamma.cwiseProduct(c.kk_gamma());
  // rowsum(Z) - colsum(Z) first, as on the GPU: exactly 0 for a one-token chunk.
  VectorMap<Scalar> d_cum_gate = scratch.vector(n);
  d_cum_gate = z.rowwise().sum() - z.colwise().sum().transpose();
  d_cum_gate += e_grads.topRows(n).cwiseProduct(c.q_state()).rowwise().sum() +
                e_grads.bottomRows(n).cwiseProduct(c.k_state()).rowwise().sum() - to_end_terms;
  d_cum_gate(n - 1) += c.decay_total * S0.cwiseProduct(dS_end).sum() + to_end_terms.sum();
  // G = cumsum(g) within the chunk  =>  dg_j = sum_{i >= j} dG_i
  Scalar running = 0;
  for (int64_t i = n - 1; i >= 0; --i) out.dg(begin + i) = running += d_cum_gate(i);

  // dS0 = e^{G_last} dS_end + [Q; K]^T [diag(E) dO; -diag(E) dR]
  grad_state = c.decay_total * dS_end;
  scratch.product.add(grad_state, QK.transpose(), e_grads);
  scratch.release_to(mark);
}

// Backward of one (b, h) pair. Per segment: a forward sweep recomputes each chunk's start
// state and terms, then a reverse sweep carries dS from chunk end to chunk start. Only
// the last segment sees grad_h_final; only the segment at t = 0 reaches h0.
template <class Scalar>
void chunked_backward_head(const HeadInputs<Scalar>& in, const std::vector<Segment>& segments,
                           const Dims& d, const MatrixMap<Scalar>& grad_o,
                           const Eigen::Map<const Matrix<Scalar>>& grad_h_final,
                           Scratch<Scalar>& scratch, HeadGrads<Scalar>& out) {
  MatrixMap<Scalar> state = scratch.matrix(d.key_dim, d.value_dim);
  MatrixMap<Scalar> grad_state = scratch.matrix(d.key_dim, d.value_dim);
  std::vector<ChunkTerms<Scalar>> chunks;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    Scalar* mark = scratch.mark();
    if (segment.first == 0) state = in.h0;
    else state.setZero();
    chunks.clear();
    for (const Chunk& chunk : chunks_of(segment)) {
      chunks.emplace_back(chunk, d, scratch);
      compute_chunk_terms(in, state, scratch, chunks.back());
      chunk_end_state(in, chunks.back(), scratch, state);
    }
    if (s + 1 == segments.size()) grad_state = grad_h_final;
    else grad_state.setZero();
    for (size_t i = chunks.size(); i-- > 0;) {
      chunk_backward(in, chunks[i], grad_o, grad_state, scratch, out);
    }
    if (segment.first == 0) out.dh0 = grad_state;
    scratch.release_to(mark);
  }
  if (segments.empty()) out.dh0 = grad_h_final;  // T = 0: h_final = h0
}

template <class Scalar>
int64_t backward_scratch_elements(const Dims& d, const std::vector<Segment>& segments) {
  using S = Scratch<Scalar>;
  const int64_t per_chunk = std::max(chunk_backward_scratch_elements<Scalar>(d),
                                     S::rounded(kGatedDeltaRuleChunkSize * d.value_dim));
  return HeadInputs<Scalar>::elements(d) + S::rounded(d.seq_len * d.value_dim) +
         HeadGrads<Scalar>::elements(d) + 2 * S::rounded(d.key_dim * d.value_dim) +
         most_chunks_in_a_segment(segments) * ChunkTerms<Scalar>::elements(d) + per_chunk;
}

// Work per (b, h) pair, for parallel_for's serial/parallel decision.
int64_t pair_cost(const Dims& d) {
  return std::max<int64_t>(1, d.seq_len * (d.key_dim + kGatedDeltaRuleChunkSize) * d.value_dim);
}

}  // namespace

void gated_delta_rule_chunked(const GatedDeltaRuleArgs& args, GatedDeltaRuleResult& out) {
  dispatch_floating("gated_delta_rule", args.q.dtype(), [&]<class Scalar>() {
    const Dims d = dims_of(args);
    const std::vector<int64_t> doc_ids = doc_ids_of(args);
    Scalar* o_data = out.o.data<Scalar>();
    Scalar* fit_data = out.fit_error.defined() ? out.fit_error.data<Scalar>() : nullptr;
    Scalar* state_data = out.h_final.data<Scalar>();
    parallel_for(d.batch * d.heads, pair_cost(d), [&](int64_t pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      const std::vector<Segment> segments = document_segments(doc_ids, b, d.seq_len);
      Scratch<Scalar> scratch(forward_scratch_elements<Scalar>(d, fit_data != nullptr));
      const HeadInputs<Scalar> in(args, d, b, h, segments, scratch);
      MatrixMap<Scalar> o = scratch.matrix(d.seq_len, d.value_dim);
      VectorMap<Scalar> fit_error = scratch.vector(fit_data ? d.seq_len : 0);
      MatrixMap<Scalar> state(state_data + pair * d.key_dim * d.value_dim, d.key_dim,
                              d.value_dim);
      chunked_forward_head(in, segments, d, scratch, o, fit_data ? &fit_error : nullptr, state);
      scatter_head(o, o_data, d, b, h);
      if (fit_data) scatter_gate(fit_error, fit_data, d, b, h);
    });
  });
}

void gated_delta_rule_backward(const GatedDeltaRuleArgs& args, const Tensor& grad_o,
                               const Tensor& grad_h_final, const GatedDeltaRuleSaved* saved,
                               GatedDeltaRuleGrads& grads) {
  HAM_CHECK(saved == nullptr,
            "gated_delta_rule_backward (cpu): given a saved forward state, which only another "
            "backend's forward makes (the CPU's keeps none)");
  dispatch_floating("gated_delta_rule_backward", args.q.dtype(), [&]<class Scalar>() {
    const Dims d = dims_of(args);
    const std::vector<int64_t> doc_ids = doc_ids_of(args);
    const int64_t state_size = d.key_dim * d.value_dim;
    Scalar* dq = grads.dq.defined() ? grads.dq.data<Scalar>() : nullptr;
    Scalar* dk = grads.dk.defined() ? grads.dk.data<Scalar>() : nullptr;
    parallel_for(d.batch * d.heads, 3 * pair_cost(d), [&](int64_t pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      const std::vector<Segment> segments = document_segments(doc_ids, b, d.seq_len);
      Scratch<Scalar> scratch(backward_scratch_elements<Scalar>(d, segments));
      const HeadInputs<Scalar> in(args, d, b, h, segments, scratch);
      MatrixMap<Scalar> head_grad_o = scratch.matrix(d.seq_len, d.value_dim);
      gather_head(grad_o.data<Scalar>(), d, b, h, head_grad_o);
      const Eigen::Map<const Matrix<Scalar>> head_grad_h_final(
          grad_h_final.data<Scalar>() + pair * state_size, d.key_dim, d.value_dim);
      HeadGrads<Scalar> g(d, scratch);
      chunked_backward_head(in, segments, d, head_grad_o, head_grad_h_final, scratch, g);
      if (dq || dk) scatter_queries_and_keys(g.dqk, d, b, h, segments, dq, dk);
      if (grads.dv.defined()) scatter_head(g.dv, grads.dv.data<Scalar>(), d, b, h);
      if (grads.dg.defined()) scatter_gate(g.dg, grads.dg.data<Scalar>(), d, b, h);
      if (grads.dbeta.defined()) scatter_gate(g.dbeta, grads.dbeta.data<Scalar>(), d, b, h);
      if (grads.dh0.defined()) {
        Eigen::Map<Matrix<Scalar>>(grads.dh0.data<Scalar>() + pair * state_size, d.key_dim,
                                   d.value_dim) = g.dh0;
      }
    });
  });
}

// The recurrence, token by token, straight from the definition (plain loops, no Eigen;
// core/cpu/gated_delta_rule_step.h), the state reset at document starts.
void gated_delta_rule_naive(const GatedDeltaRuleArgs& args, GatedDeltaRuleResult& out) {
  dispatch_floating("gated_delta_rule_naive", args.q.dtype(), [&]<class Scalar>() {
    const Dims d = dims_of(args);
    const int64_t K = d.key_dim, V = d.value_dim;
    const std::vector<int64_t> doc_ids = doc_ids_of(args);
    const Scalar *q = args.q.data<Scalar>(), *k = args.k.data<Scalar>(),
                 *v = args.v.data<Scalar>(), *g = args.g.data<Scalar>(),
                 *beta = args.beta.data<Scalar>();
    const Scalar* h0 = args.h0.defined() ? args.h0.data<Scalar>() : nullptr;
    Scalar *o = out.o.data<Scalar>(), *h_final = out.h_final.data<Scalar>();
    Scalar* fit = out.fit_error.defined() ? out.fit_error.data<Scalar>() : nullptr;
    parallel_for(d.batch * d.heads, std::max<int64_t>(1, d.seq_len * K * V), [&](int64_t pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      std::vector<Scalar> S(static_cast<size_t>(K * V), Scalar(0));
      std::vector<Scalar> p(static_cast<size_t>(V)), r(static_cast<size_t>(V));
      if (h0) {
        for (int64_t i = 0; i < K * V; ++i) S[size_t(i)] = h0[pair * K * V + i];
      }
      for (int64_t t = 0; t < d.seq_len; ++t) {
        const int64_t row = (b * d.seq_len + t) * d.heads + h;  // index into [B, T, H]
        if (t > 0 && !doc_ids.empty() &&
            doc_ids[size_t(b * d.seq_len + t)] != doc_ids[size_t(b * d.seq_len + t - 1)]) {
          std::fill(S.begin(), S.end(), Scalar(0));  // document start
        }
        const Scalar fit_error =
            gated_delta_rule_token(S.data(), K, V, q + row * K, k + row * K, v + row * V, g[row],
                                   beta[row], o + row * V, p.data(), r.data());
        if (fit) fit[row] = fit_error;
      }
      for (int64_t i = 0; i < K * V; ++i) h_final[pair * K * V + i] = S[size_t(i)];
    });
  });
}

}  // namespace ham::cpu
