// CPU gated delta rule: the chunked forward and its backward (Eigen, one (b, h) pair per
// thread), and the token-by-token recurrence. The math is in core/ops/gated_delta_rule.h;
// each step below names the formula it implements.
//
// Layout: each (b, h) pair's rows are copied out of [B, T, H, D] into contiguous
// row-major [T, D] matrices; chunks are row blocks of those. Documents are independent
// segments [begin, end): every segment is chunked from its own first token, so no chunk
// holds a document start and no masking across documents is needed.
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cpu/gated_delta_rule_step.h"
#include "core/cpu/parallel.h"
#include "core/ops/gated_delta_rule.h"

namespace ham::cpu {

namespace {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

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

// Rows of head h, batch b of a [B, T, H, width] tensor as a contiguous [T, width] matrix.
template <class Scalar>
Matrix<Scalar> gather_head(const Scalar* base, const Dims& d, int64_t b, int64_t h,
                           int64_t width) {
  Matrix<Scalar> rows(d.seq_len, width);
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const Scalar* src = base + ((b * d.seq_len + t) * d.heads + h) * width;
    for (int64_t j = 0; j < width; ++j) rows(t, j) = src[j];
  }
  return rows;
}

template <class Scalar>
void scatter_head(const Matrix<Scalar>& rows, Scalar* base, const Dims& d, int64_t b, int64_t h) {
  const int64_t width = rows.cols();
  for (int64_t t = 0; t < d.seq_len; ++t) {
    Scalar* dst = base + ((b * d.seq_len + t) * d.heads + h) * width;
    for (int64_t j = 0; j < width; ++j) dst[j] = rows(t, j);
  }
}

// Per-token gates [B, T, H] of one head as a [T] vector, and back.
template <class Scalar>
Vector<Scalar> gather_gate(const Scalar* base, const Dims& d, int64_t b, int64_t h) {
  Vector<Scalar> gate(d.seq_len);
  for (int64_t t = 0; t < d.seq_len; ++t) gate(t) = base[(b * d.seq_len + t) * d.heads + h];
  return gate;
}

template <class Scalar>
void scatter_gate(const Vector<Scalar>& gate, Scalar* base, const Dims& d, int64_t b, int64_t h) {
  for (int64_t t = 0; t < d.seq_len; ++t) base[(b * d.seq_len + t) * d.heads + h] = gate(t);
}

// One (b, h) pair's inputs, contiguous.
template <class Scalar>
struct HeadInputs {
  Matrix<Scalar> q, k, v;  // [T, K], [T, K], [T, V]
  Vector<Scalar> g, beta;  // [T]
  Matrix<Scalar> h0;       // [K, V]; zeros without an initial state

  HeadInputs(const GatedDeltaRuleArgs& a, const Dims& d, int64_t b, int64_t h)
      : q(gather_head(a.q.data<Scalar>(), d, b, h, d.key_dim)),
        k(gather_head(a.k.data<Scalar>(), d, b, h, d.key_dim)),
        v(gather_head(a.v.data<Scalar>(), d, b, h, d.value_dim)),
        g(gather_gate(a.g.data<Scalar>(), d, b, h)),
        beta(gather_gate(a.beta.data<Scalar>(), d, b, h)),
        h0(Matrix<Scalar>::Zero(d.key_dim, d.value_dim)) {
    if (a.h0.defined()) {
      h0 = Eigen::Map<const Matrix<Scalar>>(
          a.h0.data<Scalar>() + (b * d.heads + h) * d.key_dim * d.value_dim, d.key_dim,
          d.value_dim);
    }
  }
};

// Everything of one chunk that the forward output and the backward read, given the
// chunk's start state S0. Rows [begin, begin + size) of the head.
template <class Scalar>
struct ChunkTerms {
  int64_t begin = 0, size = 0;
  Matrix<Scalar> state_in;      // S0 [K, V]
  Vector<Scalar> decay;         // E_i = e^{G_i}, G = chunk-local cumsum of g
  Vector<Scalar> decay_to_end;  // e^{G_last - G_i}
  Scalar decay_total = 1;       // e^{G_last}
  Matrix<Scalar> gamma;         // Gamma_ij = e^{G_i - G_j} for j <= i, 0 above the diagonal
  Matrix<Scalar> kk_gamma;      // M = strict_tril(K K^T * Gamma)
  Matrix<Scalar> qk_gamma;      // P = tril(Q K^T * Gamma), diagonal included
  Matrix<Scalar> write_lower;   // diag(beta) M: strictly lower part of I + diag(beta) M
  Matrix<Scalar> k_state;       // K S0 [c, V]
  Matrix<Scalar> q_state;       // Q S0 [c, V]
  Matrix<Scalar> residual;      // R = V - diag(E) K S0
  Matrix<Scalar> v_new;         // u: (I + diag(beta) M) u = diag(beta) R
};

template <class Scalar>
void compute_chunk_terms(const HeadInputs<Scalar>& in, int64_t begin, int64_t size,
                         const Matrix<Scalar>& state_in, ChunkTerms<Scalar>& c) {
  const auto Q = in.q.middleRows(begin, size);
  const auto K = in.k.middleRows(begin, size);
  const auto V = in.v.middleRows(begin, size);
  const auto beta = in.beta.segment(begin, size);
  c.begin = begin;
  c.size = size;
  c.state_in = state_in;

  // G in the compute dtype; every exponent below is of G_i - G_j with j <= i (<= 0 for
  // g <= 0), taken only where the mask keeps it: no e^{-G}, no inf * 0.
  Vector<Scalar> cum_gate(size);
  Scalar running = 0;
  for (int64_t i = 0; i < size; ++i) cum_gate(i) = running += in.g(begin + i);
  const Scalar last = cum_gate(size - 1);
  c.decay = cum_gate.array().exp();
  c.decay_to_end = (last - cum_gate.array()).exp();
  c.decay_total = std::exp(last);
  c.gamma = Matrix<Scalar>::Zero(size, size);
  for (int64_t i = 0; i < size; ++i) {  // row i: e^{G_i - G_j}, j = 0..i
    c.gamma.row(i).head(i + 1) = (cum_gate(i) - cum_gate.head(i + 1).array()).exp().transpose();
  }

  Matrix<Scalar> kk = K * K.transpose();
  Matrix<Scalar> qk = Q * K.transpose();
  kk = kk.cwiseProduct(c.gamma);
  c.kk_gamma = kk.template triangularView<Eigen::StrictlyLower>();
  c.qk_gamma = qk.cwiseProduct(c.gamma);  // Gamma is already 0 above the diagonal
  c.write_lower = beta.asDiagonal() * c.kk_gamma;

  c.k_state.noalias() = K * state_in;
  c.q_state.noalias() = Q * state_in;
  c.residual = V - c.decay.asDiagonal() * c.k_state;
  // Forward substitution with the unit lower-triangular I + diag(beta) M; this is
  // v_new = A diag(beta) V - A diag(beta E) K S0 = U - W S0 without forming A.
  c.v_new = c.write_lower.template triangularView<Eigen::UnitLower>().solve(
      beta.asDiagonal() * c.residual);
}

// S_end = e^{G_last} S0 + K^T diag(e^{G_last - G}) v_new
template <class Scalar>
Matrix<Scalar> chunk_end_state(const HeadInputs<Scalar>& in, const ChunkTerms<Scalar>& c) {
  const auto K = in.k.middleRows(c.begin, c.size);
  Matrix<Scalar> state = c.decay_total * c.state_in;
  state.noalias() += K.transpose() * (c.decay_to_end.asDiagonal() * c.v_new);
  return state;
}

// Chunked forward of one (b, h) pair: fills o [T, V], fit_error [T] (where not null),
// final state [K, V].
template <class Scalar>
void chunked_forward_head(const HeadInputs<Scalar>& in, const std::vector<Segment>& segments,
                          Matrix<Scalar>& o, Vector<Scalar>* fit_error, Matrix<Scalar>& state) {
  ChunkTerms<Scalar> c;
  for (const auto& [seg_begin, seg_end] : segments) {
    if (seg_begin == 0) state = in.h0;
    else state.setZero();  // document start: the state resets
    for (int64_t begin = seg_begin; begin < seg_end; begin += kGatedDeltaRuleChunkSize) {
      const int64_t size = std::min(kGatedDeltaRuleChunkSize, seg_end - begin);
      compute_chunk_terms(in, begin, size, state, c);
      // O = diag(E) Q S0 + P v_new
      o.middleRows(begin, size) = c.decay.asDiagonal() * c.q_state + c.qk_gamma * c.v_new;
      if (fit_error != nullptr) {
        // Predictions of the decayed pre-write state: p = diag(E) K S0 + M v_new.
        // (p = V - v_new / beta too, but that divides by beta, which may be 0.)
        Matrix<Scalar> prediction = c.decay.asDiagonal() * c.k_state + c.kk_gamma * c.v_new;
        for (int64_t i = 0; i < size; ++i) {
          const auto p = prediction.row(i);
          const auto v = in.v.row(begin + i);
          (*fit_error)(begin + i) =
              Scalar(1) - p.dot(v) / (p.norm() * v.norm() + Scalar(kFitEpsilon));
        }
      }
      state = chunk_end_state(in, c);
    }
  }
  if (segments.empty()) state = in.h0;  // T = 0
}

// Gradients of one (b, h) pair, [T, D] / [T] like the inputs.
template <class Scalar>
struct HeadGrads {
  Matrix<Scalar> dq, dk, dv;
  Vector<Scalar> dg, dbeta;
  Matrix<Scalar> dh0;
  explicit HeadGrads(const Dims& d)
      : dq(Matrix<Scalar>::Zero(d.seq_len, d.key_dim)),
        dk(Matrix<Scalar>::Zero(d.seq_len, d.key_dim)),
        dv(Matrix<Scalar>::Zero(d.seq_len, d.value_dim)),
        dg(Vector<Scalar>::Zero(d.seq_len)),
        dbeta(Vector<Scalar>::Zero(d.seq_len)),
        dh0(Matrix<Scalar>::Zero(d.key_dim, d.value_dim)) {}
};

// Backward of one chunk. grad_state holds dS_end on entry and dS0 on return.
template <class Scalar>
void chunk_backward(const HeadInputs<Scalar>& in, const ChunkTerms<Scalar>& c,
                    const Matrix<Scalar>& grad_o, Matrix<Scalar>& grad_state,
                    HeadGrads<Scalar>& out) {
  const int64_t n = c.size;
  const auto Q = in.q.middleRows(c.begin, n);
  const auto K = in.k.middleRows(c.begin, n);
  const auto beta = in.beta.segment(c.begin, n);
  const auto dO = grad_o.middleRows(c.begin, n);
  const Matrix<Scalar>& S0 = c.state_in;
  const Matrix<Scalar>& u = c.v_new;
  const Matrix<Scalar> dS_end = grad_state;

  // du = P^T dO + diag(e^{G_last-G}) K dS_end
  Matrix<Scalar> k_dstate = K * dS_end;
  Matrix<Scalar> du = c.qk_gamma.transpose() * dO;
  du.noalias() += c.decay_to_end.asDiagonal() * k_dstate;

  // Through (I + diag(beta) M) u = diag(beta) R:  dX = (I + diag(beta) M)^-T du
  // (back substitution), dR = diag(beta) dX, and d(I + diag(beta) M) = -dX u^T.
  Matrix<Scalar> d_rhs =
      c.write_lower.template triangularView<Eigen::UnitLower>().transpose().solve(du);
  Matrix<Scalar> d_residual = beta.asDiagonal() * d_rhs;
  Matrix<Scalar> dx_u = d_rhs * u.transpose();
  // dM = -strict_tril(diag(beta) dX u^T)
  Matrix<Scalar> scaled_dx_u = -(beta.asDiagonal() * dx_u);
  Matrix<Scalar> d_kk_gamma = scaled_dx_u.template triangularView<Eigen::StrictlyLower>();
  // dbeta_i = sum_j -(dX u^T)_ij M_ij + <dX_i, R_i>   (M is 0 on and above the diagonal)
  out.dbeta.segment(c.begin, n) = -(dx_u.cwiseProduct(c.kk_gamma)).rowwise().sum() +
                                  d_rhs.cwiseProduct(c.residual).rowwise().sum();
  // R = V - diag(E) K S0:  dv = dR
  out.dv.middleRows(c.begin, n) = d_residual;

  // dP = tril(dO u^T); products with Gamma (0 above the diagonal) apply the mask.
  Matrix<Scalar> d_qk = dO * u.transpose();
  Matrix<Scalar> d_qk_masked = d_qk.cwiseProduct(c.gamma);        // dP * Gamma
  Matrix<Scalar> d_kk_masked = d_kk_gamma.cwiseProduct(c.gamma);  // dM * Gamma

  // dq = diag(E) dO S0^T + (dP * Gamma) K
  Matrix<Scalar> e_do = c.decay.asDiagonal() * dO;
  Matrix<Scalar> e_dr = c.decay.asDiagonal() * d_residual;
  auto dq = out.dq.middleRows(c.begin, n);
  dq.noalias() = e_do * S0.transpose();
  dq.noalias() += d_qk_masked * K;

  // dk = diag(e^{G_last-G}) u dS_end^T - diag(E) dR S0^T + (dP * Gamma)^T Q
  //      + (dM * Gamma) K + (dM * Gamma)^T K
  auto dk = out.dk.middleRows(c.begin, n);
  dk.noalias() = (c.decay_to_end.asDiagonal() * u) * dS_end.transpose();
  dk.noalias() -= e_dr * S0.transpose();
  dk.noalias() += d_qk_masked.transpose() * Q;
  dk.noalias() += (d_kk_masked + d_kk_masked.transpose()) * K;

  // dG_i = E_i <dO_i, (Q S0)_i> - E_i <dR_i, (K S0)_i> - e^{G_last-G_i} <(K dS_end)_i, u_i>
  //        + rowsum(Z)_i - colsum(Z)_i,  Z = dP * P + dM * M  (from Gamma_ij = e^{G_i-G_j})
  //        + [i = last] (e^{G_last} <S0, dS_end> + sum_j e^{G_last-G_j} <(K dS_end)_j, u_j>)
  Vector<Scalar> to_end_terms =
      c.decay_to_end.cwiseProduct(k_dstate.cwiseProduct(u).rowwise().sum());
  Matrix<Scalar> z = d_qk.cwiseProduct(c.qk_gamma) + d_kk_gamma.cwiseProduct(c.kk_gamma);
  // rowsum(Z) - colsum(Z) first, as on the GPU: exactly 0 for a one-token chunk.
  Vector<Scalar> d_cum_gate = z.rowwise().sum() - z.colwise().sum().transpose();
  d_cum_gate += e_do.cwiseProduct(c.q_state).rowwise().sum() -
                e_dr.cwiseProduct(c.k_state).rowwise().sum() - to_end_terms;
  d_cum_gate(n - 1) += c.decay_total * S0.cwiseProduct(dS_end).sum() + to_end_terms.sum();
  // G = cumsum(g) within the chunk  =>  dg_j = sum_{i >= j} dG_i
  Scalar running = 0;
  for (int64_t i = n - 1; i >= 0; --i) out.dg(c.begin + i) = running += d_cum_gate(i);

  // dS0 = e^{G_last} dS_end + Q^T diag(E) dO - K^T diag(E) dR
  grad_state = c.decay_total * dS_end;
  grad_state.noalias() += Q.transpose() * e_do;
  grad_state.noalias() -= K.transpose() * e_dr;
}

// Backward of one (b, h) pair. Per segment: a forward sweep recomputes each chunk's start
// state and terms, then a reverse sweep carries dS from chunk end to chunk start. Only
// the last segment sees grad_h_final; only the segment at t = 0 reaches h0.
template <class Scalar>
void chunked_backward_head(const HeadInputs<Scalar>& in, const std::vector<Segment>& segments,
                           const Matrix<Scalar>& grad_o, const Matrix<Scalar>& grad_h_final,
                           HeadGrads<Scalar>& out) {
  std::vector<ChunkTerms<Scalar>> chunks;
  Matrix<Scalar> state, grad_state;
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto [seg_begin, seg_end] = segments[s];
    state = seg_begin == 0 ? in.h0 : Matrix<Scalar>::Zero(in.h0.rows(), in.h0.cols());
    chunks.clear();
    for (int64_t begin = seg_begin; begin < seg_end; begin += kGatedDeltaRuleChunkSize) {
      chunks.emplace_back();
      compute_chunk_terms(in, begin, std::min(kGatedDeltaRuleChunkSize, seg_end - begin), state,
                          chunks.back());
      state = chunk_end_state(in, chunks.back());
    }
    const bool last_segment = s + 1 == segments.size();
    grad_state = last_segment ? grad_h_final : Matrix<Scalar>::Zero(in.h0.rows(), in.h0.cols());
    for (size_t i = chunks.size(); i-- > 0;) chunk_backward(in, chunks[i], grad_o, grad_state, out);
    if (seg_begin == 0) out.dh0 = grad_state;
  }
  if (segments.empty()) out.dh0 = grad_h_final;  // T = 0: h_final = h0
}

// Keeps Eigen's products on the calling thread while alive. (b, h) pairs are the unit of
// parallelism; with fewer pairs than threads Eigen would split each chunk-sized product
// across threads, and on a busy machine every such split waits a scheduler quantum
// (measured: 100x slower for one head on 2 threads). Restores the thread count after.
class EigenOnThisThread {
 public:
  EigenOnThisThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~EigenOnThisThread() { omp_set_num_threads(saved_); }
  EigenOnThisThread(const EigenOnThisThread&) = delete;
  EigenOnThisThread& operator=(const EigenOnThisThread&) = delete;

 private:
  int saved_;
};

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
      EigenOnThisThread single_threaded;
      const int64_t b = pair / d.heads, h = pair % d.heads;
      HeadInputs<Scalar> in(args, d, b, h);
      Matrix<Scalar> o(d.seq_len, d.value_dim), state(d.key_dim, d.value_dim);
      Vector<Scalar> fit_error(fit_data ? d.seq_len : 0);
      chunked_forward_head(in, document_segments(doc_ids, b, d.seq_len), o,
                           fit_data ? &fit_error : nullptr, state);
      scatter_head(o, o_data, d, b, h);
      if (fit_data) scatter_gate(fit_error, fit_data, d, b, h);
      Eigen::Map<Matrix<Scalar>>(state_data + pair * d.key_dim * d.value_dim, d.key_dim,
                                 d.value_dim) = state;
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
    parallel_for(d.batch * d.heads, 3 * pair_cost(d), [&](int64_t pair) {
      EigenOnThisThread single_threaded;
      const int64_t b = pair / d.heads, h = pair % d.heads;
      HeadInputs<Scalar> in(args, d, b, h);
      Matrix<Scalar> head_grad_o = gather_head(grad_o.data<Scalar>(), d, b, h, d.value_dim);
      Matrix<Scalar> head_grad_h_final = Eigen::Map<const Matrix<Scalar>>(
          grad_h_final.data<Scalar>() + pair * state_size, d.key_dim, d.value_dim);
      HeadGrads<Scalar> g(d);
      chunked_backward_head(in, document_segments(doc_ids, b, d.seq_len), head_grad_o,
                            head_grad_h_final, g);
      if (grads.dq.defined()) scatter_head(g.dq, grads.dq.data<Scalar>(), d, b, h);
      if (grads.dk.defined()) scatter_head(g.dk, grads.dk.data<Scalar>(), d, b, h);
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
